/**
 * `ipwarden daemon` flags → DaemonOptions (src/cli/daemon.ts), through runMain with an injected
 * starter: defaults, every flag, and every bad value (UsageError, exit status 2, exact message).
 */
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import type { DaemonOptions } from '../../src/common/daemon-options.ts';
import type { CliContext } from '../../src/cli/context.ts';
import { runMain } from '../../src/cli/main.ts';

async function run(argv: string[], withStarter = true): Promise<{ code: number; stderr: string; got: DaemonOptions | null }> {
  let stderr = '';
  let got: DaemonOptions | null = null;
  const ctx: CliContext = { stdout: () => {}, stderr: (t) => void (stderr += t), env: {}, now: () => 0 };
  const code = await runMain(['daemon', ...argv], ctx, withStarter ? { daemon: async (o) => ((got = o), 0) } : {});
  return { code, stderr, got };
}

describe('ipwarden daemon flags', () => {
  it('defaults (ARCHITECTURE.md CLI contract)', async () => {
    const r = await run([]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.got, {
      socket: '/run/ipwarden/plugin.sock',
      metricsAddress: { host: '127.0.0.1', port: 9617 },
      intervalSeconds: 60,
      logLevel: 'info',
      dataDir: '/var/lib/cni/networks',
      network: null,
      runtimeEndpoint: null,
      graceSeconds: 300,
      policy: 'conservative',
      cniConfDir: '/etc/cni/net.d',
      auditLog: null,
      warmUpPairs: 2000,
    });
  });

  it('--help names NODE_NAME, the node\'s identity in every cluster pool, in an Environment section before the examples', async () => {
    let out = '';
    const ctx: CliContext = { stdout: (t) => void (out += t), stderr: (t) => void (out += t), env: {}, now: () => 0 };
    assert.equal(await runMain(['daemon', '--help'], ctx), 0, out);
    const tail = out.slice(out.indexOf('\nEnvironment:\n'));
    assert.equal(
      tail,
      [
        '',
        'Environment:',
        "  NODE_NAME  this node's name in every cluster pool (its heartbeat, blocks and",
        "             handles) unless a network's ipam.nodeName sets one; the DaemonSet",
        '             sets it from spec.nodeName (unset: the node-name file beside the',
        '             installed plugin, else the host name)',
        '',
        'Examples:',
        '  ipwarden daemon',
        '  ipwarden daemon --socket /run/ipwarden/plugin.sock --log-level debug',
        '  ipwarden daemon --cni-bin-dir /host/opt/cni/bin',
        '',
        '',
      ].join('\n'),
    );
  });

  it('every flag', async () => {
    const r = await run([
      '--socket', '/tmp/x/p.sock', '--metrics-address', '[::1]:0', '--interval', '90s', '--log-level', 'debug',
      '--data-dir', '/d', '--network', 'cbr0', '--runtime-endpoint', 'unix:///run/c.sock', '--grace', '2m',
      '--policy', 'reclaim-notready', '--cni-conf-dir', '/c', '--audit-log', '/a.log', '--cni-bin-dir', '/host/opt/cni/bin/',
      '--warm-up', '0',
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.got, {
      socket: '/tmp/x/p.sock',
      metricsAddress: { host: '::1', port: 0 },
      intervalSeconds: 90,
      logLevel: 'debug',
      dataDir: '/d',
      network: 'cbr0',
      runtimeEndpoint: 'unix:///run/c.sock',
      graceSeconds: 120,
      policy: 'reclaim-notready',
      cniConfDir: '/c',
      auditLog: '/a.log',
      cniBinDir: '/host/opt/cni/bin',
      warmUpPairs: 0,
    });
  });

  it('host names and 0.0.0.0 are valid metrics hosts', async () => {
    assert.deepEqual((await run(['--metrics-address', 'localhost:80'])).got?.metricsAddress, { host: 'localhost', port: 80 });
    assert.deepEqual((await run(['--metrics-address', '0.0.0.0:65535'])).got?.metricsAddress, { host: '0.0.0.0', port: 65535 });
  });

  const long = `/${'s'.repeat(107)}`;
  const bad: Array<[string[], string]> = [
    [['--interval', '0s'], '--interval: must be positive, got "0s"'],
    [['--interval', '-1m'], '--interval: must be positive, got "-1m"'],
    [['--interval', '5'], '--interval: invalid duration "5" (time: missing unit in duration "5")'],
    [['--grace', '-1s'], '--grace: must not be negative, got "-1s"'],
    [['--grace', 'soon'], '--grace: invalid duration "soon" (time: invalid duration "soon")'],
    [['--metrics-address', '9617'], '--metrics-address: want HOST:PORT, got "9617"'],
    [['--metrics-address', 'h:70000'], '--metrics-address: the port must be a number from 0 to 65535, got "h:70000"'],
    [['--metrics-address', 'h:'], '--metrics-address: the port must be a number from 0 to 65535, got "h:"'],
    [['--metrics-address', '::1:80'], '--metrics-address: an IPv6 host must be in brackets ([::1]:9617), got "::1:80"'],
    [['--metrics-address', '[::1]80'], '--metrics-address: want HOST:PORT or [IPV6]:PORT, got "[::1]80"'],
    [['--metrics-address', 'a b:80'], '--metrics-address: invalid host, got "a b:80"'],
    [['--socket', 'run/p.sock'], '--socket: must be an absolute path, got "run/p.sock"'],
    [['--socket', '/run/ipwarden/'], '--socket: must name a file, not a directory, got "/run/ipwarden/"'],
    [['--socket', '/run/../p.sock'], '--socket: must not contain "." or ".." components, got "/run/../p.sock"'],
    [['--socket', long], `--socket: is 108 bytes, the limit is 107 (sun_path), got "${long}"`],
    [['--log-level', 'verbose'], '--log-level: must be one of fatal, error, warn, info, debug, trace, silent, got "verbose"'],
    [['--policy', 'eager'], '--policy: must be conservative or reclaim-notready, got "eager"'],
    [['--network', '../x'], '--network: invalid network name "../x" (letters, digits, "_", ".", "-"; starting with a letter or digit)'],
    [['--runtime-endpoint', 'tcp://h:1'], '--runtime-endpoint: unsupported runtime endpoint "tcp://h:1": want unix:///path/to/socket or /path/to/socket'],
    [['--data-dir', ''], '--data-dir must not be empty'],
    [['--cni-conf-dir', ''], '--cni-conf-dir must not be empty'],
    [['--audit-log', ''], '--audit-log must not be empty'],
    [['--cni-bin-dir', 'opt/cni/bin'], '--cni-bin-dir must be an absolute path without "." or ".." components, got "opt/cni/bin"'],
    [['--cni-bin-dir', '/opt/../bin'], '--cni-bin-dir must be an absolute path without "." or ".." components, got "/opt/../bin"'],
  ];
  bad.forEach(([argv, msg]) =>
    it(`usage error: ${argv.join(' ')}`, async () => {
      const r = await run(argv);
      assert.equal(r.code, 2);
      assert.equal(r.stderr, `ipwarden: ${msg}\n`);
      assert.equal(r.got, null);
    }),
  );

  it('without a starter (a CLI not wired to the daemon): exit 1, after the flags were checked', async () => {
    assert.equal((await run(['--interval', 'x'], false)).code, 2);
    const r = await run([], false);
    assert.equal(r.code, 1);
    assert.equal(r.stderr, 'ipwarden: this build of ipwarden has no daemon\n');
  });
});
