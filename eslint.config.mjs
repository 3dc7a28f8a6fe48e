// ESLint flat config for the JupyterLab panel (labextension/): typescript-eslint's type-aware
// rules plus the template's house rules; formatting is prettier's job (eslint-config-prettier).
import js from '@eslint/js';
import prettierRecommended from 'eslint-plugin-prettier/recommended';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'node_modules/**',
      'labextension/lib/**',
      'gpulayer_kernel/**',
      '**/*.d.ts',
      '.venv/**'
    ]
  },
  {
    files: ['labextension/**/*.{ts,tsx}'],
    extends: [
      js.configs.recommended,
      ...tseslint.configs.recommendedTypeChecked
    ],
    languageOptions: {
      parserOptions: {
        project: ['./tsconfig.json', './tsconfig.test.json'],
        tsconfigRootDir: import.meta.dirname
      }
    },
    rules: {
      '@typescript-eslint/naming-convention': [
        'error',
        {
          selector: 'interface',
          format: ['PascalCase'],
          custom: { regex: '^I[A-Z]', match: true }
        }
      ],
      '@typescript-eslint/no-unused-vars': ['error', { args: 'none' }],
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/explicit-module-boundary-types': 'error',
      curly: ['error', 'all'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error'
    }
  },
  // The panel's layers, as on the Python side (labextension/src/index.ts): api/ (contracts,
  // HTTP) <- model/ (state and words, no DOM) <- views/ (React) <- index.ts (the plugin).
  // A layer imports only those before it, so the model stays testable in Node.
  {
    files: ['labextension/src/api/**/*.ts', 'labextension/src/model/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['../model', '../model/*', '../views', '../views/*'],
              message: 'api/ and model/ do not import later layers'
            },
            {
              group: [
                'react',
                '@jupyterlab/apputils',
                '@jupyterlab/ui-components'
              ],
              message: 'api/ and model/ do not render: that is views/'
            }
          ]
        }
      ]
    }
  },
  // The cell widget (an anywidget ESM, bundled on its own): the API's requester and the
  // model's words, never JupyterLab (an anywidget gets none of its services) or the panel.
  {
    files: ['labextension/src/widget/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          paths: [
            {
              name: '../api',
              message:
                "import ../api/requester (not the panel's ServerConnection)"
            }
          ],
          patterns: [
            {
              group: ['@jupyterlab/*', '@lumino/*', 'react', 'react-dom'],
              message:
                'the cell widget runs outside JupyterLab: no Lab packages'
            },
            {
              group: [
                '../api/*',
                '!../api/requester',
                '../views',
                '../views/*'
              ],
              message:
                "import ../api/requester (not the panel's ServerConnection) and no views"
            }
          ]
        }
      ]
    }
  },
  prettierRecommended
);
