/**
 * Generate the panel's contract types from the contracts' JSON Schema.
 *
 * Input: `gpulayer_kernel/contracts/schema.json` (written by
 * `python -m gpulayer_kernel.contracts.schema`). Output:
 * `labextension/src/api/contracts.generated.ts` (checked in). Run it with
 * `jlpm build:contracts`. Options:
 * - `--check`: write nothing; exit 1, naming the command that fixes it, when the checked-in
 *   file differs from what the schema gives (`jlpm check:contracts`; CI runs it through
 *   `tests/test_panel_contracts.py`);
 * - `--schema PATH`: read another schema (the test checks that a changed one fails `--check`);
 * - `--out PATH`: write elsewhere.
 *
 * The generator is json-schema-to-typescript; this script only shapes its input:
 * - every contract and every `$defs` entry becomes one named type (the `$defs` of all
 *   contracts are merged; two different definitions under one name are an error);
 * - property titles are dropped, so `"title": "Job Id"` does not become `type JobId = string`;
 * - every property is required: these types describe what the server sends, and it sends
 *   every field (pydantic dumps defaults too). The schema's defaults are for input;
 * - `JsonValue` (pydantic's, an empty schema) is spelled out as the JSON union it stands for;
 * - object types are named `I<Name>` (the house rule for interfaces), enums and unions keep
 *   their contract name (`JobState`, `JsonValue`).
 */
import { readFile, writeFile } from 'node:fs/promises';
import process from 'node:process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { compile } from 'json-schema-to-typescript';
import prettier from 'prettier';

const ROOT = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  '..',
  '..'
);
const SCHEMA = path.join(ROOT, 'gpulayer_kernel', 'contracts', 'schema.json');
const TARGET = path.join(
  ROOT,
  'labextension',
  'src',
  'api',
  'contracts.generated.ts'
);

const BANNER = `/**
 * GENERATED FILE: do not edit. The GPUlayer contracts as TypeScript types, generated from
 * gpulayer_kernel/contracts/schema.json by labextension/scripts/gen-contracts.mjs
 * (json-schema-to-typescript).
 *
 * Regenerate after changing a contract:
 *   python -m gpulayer_kernel.contracts.schema && jlpm build:contracts
 *
 * Every property is required: these are the shapes the server sends, with every field.
 */`;

function isObjectSchema(schema) {
  return schema.type === 'object' && schema.properties !== undefined;
}

/** Rewrite one schema node in place: local refs, no property titles, all required. */
function shape(node, isDefinition) {
  if (Array.isArray(node)) {
    node.forEach(child => shape(child, false));
    return;
  }
  if (node === null || typeof node !== 'object') {
    return;
  }
  if (!isDefinition) {
    delete node.title;
  }
  // A default beside a `$ref` makes the generator copy the referenced type under a new name
  // (`JobState1`); defaults say nothing about what the server sends anyway.
  delete node.default;
  if (typeof node.$ref === 'string') {
    node.$ref = node.$ref.replace('#/$defs/', '#/definitions/');
  }
  if (isObjectSchema(node)) {
    node.required = Object.keys(node.properties);
    for (const child of Object.values(node.properties)) {
      shape(child, false);
    }
  }
  for (const [key, child] of Object.entries(node)) {
    if (key !== 'properties') {
      shape(child, false);
    }
  }
}

/** One schema whose `definitions` are every contract and every type they use. */
function combined(schemaFile, schemaPath) {
  const definitions = {};
  const add = (name, schema) => {
    const known = definitions[name];
    if (known && JSON.stringify(known) !== JSON.stringify(schema)) {
      throw new Error(`two different definitions of ${name} in ${schemaPath}`);
    }
    definitions[name] = schema;
  };
  const names = Object.keys(schemaFile.contracts).sort();
  for (const name of names) {
    const { $defs = {}, ...contract } = schemaFile.contracts[name];
    for (const [defName, def] of Object.entries($defs)) {
      add(defName, def);
    }
    add(name, contract);
  }
  const sorted = Object.fromEntries(
    Object.keys(definitions)
      .sort()
      .map(name => [name, structuredClone(definitions[name])])
  );
  for (const def of Object.values(sorted)) {
    shape(def, true);
  }
  if (sorted.JsonValue && Object.keys(sorted.JsonValue).length === 0) {
    sorted.JsonValue = {
      title: 'JsonValue',
      tsType:
        'null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue }'
    };
  }
  return {
    title: 'AnyContract',
    description: `Any top-level contract (${schemaFile.api_version}).`,
    anyOf: names.map(name => ({ $ref: `#/definitions/${name}` })),
    definitions: sorted
  };
}

/** The value after `flag` on the command line, as an absolute path; `fallback` without it. */
function pathArg(args, flag, fallback) {
  const index = args.indexOf(flag);
  if (index < 0) {
    return fallback;
  }
  const value = args[index + 1];
  if (value === undefined || value.startsWith('--')) {
    throw new Error(`${flag} needs a path`);
  }
  return path.resolve(value);
}

/** Where two texts first differ: the line number and both lines (for the check's message). */
function firstDifference(expected, actual) {
  const want = expected.split('\n');
  const have = actual.split('\n');
  for (let i = 0; i < Math.max(want.length, have.length); i++) {
    if (want[i] !== have[i]) {
      const show = line => (line === undefined ? '(end of file)' : line.trim());
      return `line ${i + 1}: the schema gives \`${show(want[i])}\`, the file has \`${show(have[i])}\``;
    }
  }
  return 'no line differs';
}

async function main() {
  const args = process.argv.slice(2);
  const check = args.includes('--check');
  const out = pathArg(args, '--out', TARGET);
  const schemaPath = pathArg(args, '--schema', SCHEMA);
  const schemaFile = JSON.parse(await readFile(schemaPath, 'utf8'));
  const code = await compile(combined(schemaFile, schemaPath), 'AnyContract', {
    bannerComment: BANNER,
    additionalProperties: false,
    unreachableDefinitions: true,
    unknownAny: true,
    format: false,
    customName: (schema, key) => {
      const name = schema.title ?? key;
      if (name === undefined) {
        return undefined;
      }
      const safe = name.replace(/[^A-Za-z0-9]/g, '');
      return isObjectSchema(schema) ? `I${safe}` : safe;
    }
  });
  // Formatted as the checked-in file is (prettier's config resolved for the target path),
  // so `--out elsewhere` gives byte-identical output and `prettier --check` passes.
  const options = (await prettier.resolveConfig(TARGET)) ?? {};
  const formatted = await prettier.format(code, {
    ...options,
    filepath: TARGET
  });
  const shown = file => {
    const relative = path.relative(ROOT, file);
    return relative && !relative.startsWith('..') ? relative : file;
  };
  if (check) {
    const current = await readFile(out, 'utf8').catch(() => '');
    if (current !== formatted) {
      console.error(
        `${shown(out)} is stale: it does not match ${shown(schemaPath)} ` +
          `(${firstDifference(formatted, current)}).\n` +
          'Fix: python -m gpulayer_kernel.contracts.schema && jlpm build:contracts'
      );
      process.exitCode = 1;
      return;
    }
    console.log(`${shown(out)} matches ${shown(schemaPath)}`);
    return;
  }
  await writeFile(out, formatted);
  console.log(`wrote ${path.relative(process.cwd(), out) || out}`);
}

await main();
