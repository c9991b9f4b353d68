import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { parseRuntimeEndpoint, resolveRuntimeEndpoint } from '../../src/runtime/endpoint.ts';
import { AppError } from '../../src/common/errors.ts';

const CONTAINERD = '/run/containerd/containerd.sock';
const CRIO = '/var/run/crio/crio.sock';

interface Case {
  name: string;
  flag?: string;
  env: Record<string, string>;
  existing: string[];
  want: string;
}

const cases: Case[] = [
  { name: 'flag wins over env and defaults', flag: 'unix:///a.sock', env: { CONTAINER_RUNTIME_ENDPOINT: '/b.sock' }, existing: [CONTAINERD], want: 'unix:///a.sock' },
  { name: 'bare path flag', flag: '/a/b.sock', env: {}, existing: [], want: 'unix:///a/b.sock' },
  { name: 'empty flag falls through to env', flag: '', env: { CONTAINER_RUNTIME_ENDPOINT: 'unix:///b.sock' }, existing: [], want: 'unix:///b.sock' },
  { name: 'env over defaults, even when its socket is missing', env: { CONTAINER_RUNTIME_ENDPOINT: '/b.sock' }, existing: [CONTAINERD], want: 'unix:///b.sock' },
  { name: 'empty env falls through to defaults', env: { CONTAINER_RUNTIME_ENDPOINT: '' }, existing: [CRIO], want: `unix://${CRIO}` },
  { name: 'containerd before CRI-O', env: {}, existing: [CRIO, CONTAINERD], want: `unix://${CONTAINERD}` },
  { name: 'CRI-O when containerd is absent', env: {}, existing: [CRIO], want: `unix://${CRIO}` },
];

describe('resolveRuntimeEndpoint', () => {
  cases.forEach((c) => {
    it(c.name, () => {
      const got = resolveRuntimeEndpoint(c.flag, c.env, (p) => c.existing.includes(p));
      assert.equal(got.url, c.want);
      assert.equal(`unix://${got.path}`, c.want);
    });
  });

  it('fails with RUNTIME_UNAVAILABLE (retryable) when nothing is configured or found', () => {
    assert.throws(
      () => resolveRuntimeEndpoint(undefined, {}, () => false),
      (e: unknown) => {
        assert.ok(e instanceof AppError);
        assert.equal(e.code, 'RUNTIME_UNAVAILABLE');
        assert.equal(e.isRetryable, true);
        assert.equal(
          e.message,
          'no CRI runtime found: none of /run/containerd/containerd.sock, /var/run/crio/crio.sock exists; set --runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT',
        );
        return true;
      },
    );
  });
});

describe('parseRuntimeEndpoint', () => {
  const bad: [string, string][] = [
    ['tcp://127.0.0.1:1234', 'unsupported runtime endpoint "tcp://127.0.0.1:1234": want unix:///path/to/socket or /path/to/socket'],
    ['npipe:////./pipe/containerd', 'unsupported runtime endpoint "npipe:////./pipe/containerd": want unix:///path/to/socket or /path/to/socket'],
    ['run/containerd.sock', 'unsupported runtime endpoint "run/containerd.sock": want unix:///path/to/socket or /path/to/socket'],
    ['unix://relative.sock', 'unsupported runtime endpoint "unix://relative.sock": the socket path must be absolute'],
    ['', 'runtime endpoint is empty'],
  ];
  bad.forEach(([input, message]) => {
    it(`rejects ${JSON.stringify(input)}`, () => {
      assert.throws(() => parseRuntimeEndpoint(input), { code: 'USAGE', message });
    });
  });

  it('accepts unix:// and bare paths alike', () => {
    assert.deepEqual(parseRuntimeEndpoint('unix:///run/x.sock'), { url: 'unix:///run/x.sock', path: '/run/x.sock' });
    assert.deepEqual(parseRuntimeEndpoint('/run/x.sock'), { url: 'unix:///run/x.sock', path: '/run/x.sock' });
  });
});
