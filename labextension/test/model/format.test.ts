import { describe, expect, it } from 'vitest';

import {
  cancelDialogText,
  deviceJob,
  formatAge,
  formatBytes,
  formatDevice,
  formatDeviceUse,
  formatDuration,
  formatExit,
  formatJobClock,
  formatPlacement,
  formatProgress,
  formatRequest,
  logStatusText,
  notebookPath,
  rankPrefix,
  stateTone,
  visibleText,
  workerCommand
} from '../../src/model/format';
import { HIDDEN_JOB } from '../../src/api';
import durations from '../durations.json';
import { device, job, node, withResources, worker } from '../fixtures';

describe('durations and ages', () => {
  it('writes durations as the widget and Python do (durations.json)', () => {
    for (const [seconds, text] of durations.examples as [
      number | null,
      string
    ][]) {
      expect(formatDuration(seconds === null ? Number.NaN : seconds)).toBe(
        text
      );
    }
  });

  it('stays compact at every scale', () => {
    expect(formatDuration(0)).toBe('0s');
    expect(formatDuration(4.9)).toBe('4s');
    expect(formatDuration(185)).toBe('3m 05s');
    expect(formatDuration(2 * 3600 + 10 * 60 + 7)).toBe('2h 10m');
    expect(formatDuration(3 * 86400 + 4 * 3600)).toBe('3d 4h');
    expect(formatDuration(-5)).toBe('0s');
    expect(formatDuration(Number.NaN)).toBe('–');
  });

  it('says "just now" under a second and "… ago" after', () => {
    expect(formatAge(100, 100.4)).toBe('just now');
    expect(formatAge(100, 103)).toBe('3s ago');
    expect(formatAge(105, 100)).toBe('just now'); // a clock a little ahead
  });
});

describe('sizes and devices', () => {
  it('prints binary units like GPU tools do', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(80 * 1024 ** 3)).toBe('80 GiB');
    expect(formatBytes(24 * 1024 ** 3 + 1)).toBe('24 GiB');
  });

  it('marks simulated devices', () => {
    const sim = device(1, { vendor: 'sim' });
    expect(formatDevice(sim)).toBe('#1 A100-80GB · 80 GiB (simulated)');
    const real = device(1, { vendor: 'nvidia', memory_bytes: 0 });
    expect(formatDevice(real)).toBe('#1 A100-80GB');
  });

  it('finds the job on a device through JSON string keys', () => {
    const w = worker('w1', 'box', { device_jobs: { '0': 'abc' } });
    expect(deviceJob(w, 0)).toBe('abc');
    expect(deviceJob(w, 1)).toBeNull();
  });

  it("says a device another user's job holds is busy, not a job called 'hidden'", () => {
    // The server writes HIDDEN_JOB for a job id this user may not read (visibility.py).
    const w = worker('w1', 'box', {
      device_jobs: { '0': 'abcdef0123', '1': HIDDEN_JOB }
    });
    const jobs = new Map([['abcdef0123', job('abcdef0123', 1)]]);
    const mine = jobs.get('abcdef0123')?.spec.name;
    expect(formatDeviceUse(deviceJob(w, 0), jobs)).toBe(
      `in use by ${mine} abcdef01`
    );
    expect(formatDeviceUse(deviceJob(w, 1), jobs)).toBe(
      "busy (another user's job)"
    );
    expect(formatDeviceUse(deviceJob(w, 1), jobs)).not.toContain('hidden');
    expect(formatDeviceUse(deviceJob(w, 2), jobs)).toBe('free');
    // A job the panel has not read yet still shows its id.
    expect(formatDeviceUse('fedcba9876', new Map())).toBe(
      'in use by job fedcba98'
    );
  });
});

describe('jobs', () => {
  it('describes placements on GPUs, CPUs and several nodes', () => {
    const gpus = node({ devices: [0, 1], simulated: true });
    const gang = job('a', 1, {
      placement: {
        api_version: 'gpulayer/v1',
        explanation: '',
        nodes: [
          gpus,
          { ...gpus, worker_name: 'box2', devices: [3], simulated: false }
        ]
      }
    });
    expect(formatPlacement(gang)).toBe('box GPUs 0,1 (simulated) + box2 GPU 3');
    const cpu = job('b', 2, {
      placement: {
        api_version: 'gpulayer/v1',
        explanation: '',
        nodes: [node({ devices: [], cpu_fallback: true })]
      }
    });
    expect(formatPlacement(cpu)).toBe('box CPU (fallback)');
    expect(formatPlacement(job('c', 3))).toBe('');
  });

  it('gives each state its clock', () => {
    expect(formatJobClock(job('a', 1, { submitted_at: 100 }), 130)).toBe(
      'waiting 30s'
    );
    const running = job('b', 2, {
      state: 'running',
      placed_at: 100,
      started_at: 101
    });
    expect(formatJobClock(running, 166)).toBe('for 1m 05s');
    const done = { ...running, state: 'succeeded' as const, finished_at: 105 };
    expect(formatJobClock(done, 999)).toBe('took 4s');
    expect(formatJobClock(job('c', 3, { state: 'cancelled' }), 999)).toBe('');
  });

  it('reads progress fields the job reported', () => {
    expect(formatProgress(null)).toEqual({ fraction: null, text: '' });
    expect(
      formatProgress({ step: 25, total: 100, loss: 0.31234, phase: 'train' })
    ).toEqual({
      fraction: 0.25,
      text: 'step 25/100 · loss 0.312 · phase train'
    });
    expect(formatProgress({ step: 7, samples_per_s: 1234.5 })).toEqual({
      fraction: null,
      text: 'step 7 · samples_per_s 1.23e+3'
    });
    expect(formatProgress({ step: 200, total: 100 }).fraction).toBe(1);
    expect(formatProgress({ nested: { a: 1 } }).text).toBe('');
  });

  it('says what a job asked for', () => {
    const r = (gpus: number, nodes = 1, kinds: string[] = []) =>
      formatRequest(
        withResources(job('a', 1), { gpus, nodes, gpu_kind: kinds })
      );
    expect(r(0)).toBe('CPU');
    expect(r(1, 1, ['h100'])).toBe('1 GPU (h100)');
    expect(r(2)).toBe('2 GPUs');
    expect(r(2, 2)).toBe('2×2 GPUs');
  });

  it('shows exit codes, tones and rank prefixes', () => {
    expect(formatExit(job('a', 1, { exit_code: 137 }))).toBe('exit 137');
    expect(formatExit(job('a', 1))).toBe('');
    expect(stateTone('succeeded')).toBe('ok');
    expect(stateTone('lost')).toBe('bad');
    expect(stateTone('running')).toBe('live');
    expect(stateTone('queued')).toBe('idle');
    expect(rankPrefix(null)).toBe('');
    expect(rankPrefix(3)).toBe('[r3] ');
    expect(workerCommand('https://h:8888/gpulayer/api/v1')).toBe(
      'GPULAYER_JOIN_TOKEN=<join token> gpulayer worker --server https://h:8888/gpulayer/api/v1'
    );
  });
});

describe('notebook paths', () => {
  it('maps the kernel path to one under the server root', () => {
    expect(notebookPath('/home/me/work/a/b.ipynb', '/home/me/work')).toBe(
      'a/b.ipynb'
    );
    expect(notebookPath('/home/me/work/b.ipynb', '/home/me/work/')).toBe(
      'b.ipynb'
    );
    expect(notebookPath('C:\\Users\\me\\n.ipynb', 'C:\\Users\\me')).toBe(
      'n.ipynb'
    );
    expect(notebookPath('./rel/x.ipynb', '/srv')).toBe('rel/x.ipynb');
    expect(notebookPath('/elsewhere/x.ipynb', '/home/me/work')).toBeNull();
    expect(
      notebookPath('/home/me/workshop/x.ipynb', '/home/me/work')
    ).toBeNull();
  });
});

describe('log lines with carriage returns', () => {
  it('show a progress bar as its last redraw', () => {
    expect(visibleText('\r 1/20\r 2/20\r20/20')).toBe('20/20');
    expect(visibleText('downloading\r')).toBe('downloading');
    expect(visibleText('plain line')).toBe('plain line');
    expect(visibleText('\r')).toBe('');
  });
});

describe('the log view status', () => {
  it('says a queued job is waiting to start, not loading', () => {
    expect(logStatusText('loading', 0, 'queued')).toBe('waiting to start');
    expect(logStatusText('following', 0, 'queued')).toBe('waiting to start');
    expect(logStatusText('following', 0, 'placed')).toBe('starting…');
    expect(logStatusText('loading', 0, null)).toBe('loading…');
    expect(logStatusText('following', 3, 'running')).toBe(
      '3 lines · following'
    );
    expect(logStatusText('complete', 1, 'succeeded')).toBe('1 line · complete');
    expect(logStatusText('retrying', 0, 'queued', 'offline')).toBe(
      '0 lines · reconnecting (offline)'
    );
  });
});

describe('the cancel dialog', () => {
  it('does not offer to keep a queued job running', () => {
    const queued = cancelDialogText(job('q1', 1, { state: 'queued' }));
    expect(queued.keep).toBe('Keep it queued');
    expect(queued.body).toContain('has not started');
    const running = cancelDialogText(job('r1', 2, { state: 'running' }));
    expect(running.keep).toBe('Keep it running');
    expect(running.body).toContain('stops all its processes');
  });
});
