/**
 * The operator CLI (ARCHITECTURE.md "CLI contract"). One file per command under `src/cli/`,
 * loaded lazily by its action; `runMain(argv, ctx)` is exported for tests.
 * User mistakes raise {@link UsageError}, printed without a stack, exit status 2.
 */
import { Command, CommanderError } from 'commander';
import { AppError, UsageError } from '../common/errors.ts';
import { processContext, type CliContext } from './context.ts';
import { escapeTerminal } from './format.ts';
import { IPWARDEN_VERSION } from '../cni/version.ts';
import type { ReconcileCommandOptions } from './leaks.ts';
import type { StatusOptions } from './status.ts';
import type { DoctorOptions } from './doctor.ts';
import type { DaemonCommandOptions, DaemonStarter } from './daemon.ts';
import type { PoolOptions } from './pool.ts';

/** ipwarden's version (package.json): {@link IPWARDEN_VERSION} of src/cni/version.ts. */
export const VERSION = IPWARDEN_VERSION;

/**
 * Verbs whose engine lives in a layer the CLI must not import (the daemon is a peer of the CLI):
 * the main layer (`src/cold.ts`) passes them to {@link runMain}.
 */
export interface CliStarters {
  /** Runs `ipwarden daemon` (`src/daemon/daemon.ts` `runDaemon`). */
  readonly daemon?: DaemonStarter;
}

function build(ctx: CliContext, setCode: (c: number) => void, starters: CliStarters = {}): Command {
  const program = new Command('ipwarden')
    .description('Leak-proof pod IP address management (CNI IPAM plugin and leak reconciler)')
    .exitOverride()
    .configureOutput({ writeOut: (s) => ctx.stdout(s), writeErr: (s) => ctx.stderr(s) })
    .showHelpAfterError()
    // `ipwarden --version` / `-V`: the version line alone (commander prints it and exits 0); the
    // `version` verb below adds Node.js, the CNI versions and the flock binding.
    .version(`ipwarden ${VERSION}`, '-V, --version', 'print the ipwarden version');

  program
    .command('version')
    .description('print the ipwarden version and the CNI spec versions it speaks')
    .action(async () => {
      const { SUPPORTED_VERSIONS } = await import('../cni/version.ts');
      const problem = await (await import('../store/file/flock.ts')).flockBindingProblem();
      ctx.stdout(`ipwarden ${VERSION}\nNode.js ${process.version}\nCNI protocol versions supported: ${SUPPORTED_VERSIONS.join(', ')}\nflock binding: ${problem ?? 'ok'}\n`);
      setCode(0);
    });

  program
    .command('install-cni')
    .description('write DIR/ipwarden-flock.node, DIR/ipwarden-netns, DIR/ipwarden-standalone (the plugin, with its own Node.js) and DIR/ipwarden (the exec shim)')
    .requiredOption('--dest <DIR>', 'CNI bin directory, e.g. /opt/cni/bin')
    .option('--socket <PATH>', "the daemon's socket, patched into the shim (absolute, at most 107 bytes; default /run/ipwarden/plugin.sock)")
    .option('--node-name <NAME>', "the node's name for cluster pools, written to DIR/ipwarden.d/node-name (default: NODE_NAME; neither: not written)")
    .option('--runtime-endpoint <URL>', "the node's CRI socket, written to DIR/ipwarden.d/runtime-endpoint for a plugin whose ancestry finds no runtime (default: CONTAINER_RUNTIME_ENDPOINT; neither: not written)")
    .addHelpText('after', '\nExamples:\n  ipwarden install-cni --dest /opt/cni/bin\n  ipwarden install-cni --dest /opt/cni/bin --socket /run/ipwarden/plugin.sock\n  NODE_NAME=worker-1 CONTAINER_RUNTIME_ENDPOINT=unix:///run/containerd/containerd.sock ipwarden install-cni --dest /opt/cni/bin\n')
    .action(async (opts: { dest: string; socket?: string; nodeName?: string; runtimeEndpoint?: string }) => {
      const m = await import('./install-cni.ts');
      setCode(await m.run(opts, ctx));
    });

  // leaks / gc (issue 3): same flags; gc adds --dry-run and --audit-log. Engine in ./leaks.ts.
  const reconcileCommand = (name: string, description: string, example: string): Command =>
    program
      .command(name)
      .description(description)
      .option('--data-dir <DIR>', 'data dir for every network (default: each config\'s ipam.dataDir; /var/lib/cni/networks without configs)')
      .option('--network <NAME>', 'only this network (default: every network directory)')
      .option('--runtime-endpoint <URL>', 'CRI socket (default: $CONTAINER_RUNTIME_ENDPOINT, else containerd, else CRI-O)')
      .option('--grace <DUR>', 'keep unowned files younger than this (Go duration)', '5m')
      .option('--policy <P>', "conservative, or reclaim-notready: also release NOT READY sandboxes' reservations older than --grace", 'conservative')
      .option('--cni-conf-dir <DIR>', "CNI configuration directory (the networks' data dirs and ranges)", '/etc/cni/net.d')
      .option('--json', 'print the documented JSON report')
      .addHelpText('after', `\nExample:\n  ${example}\n`);
  reconcileCommand('leaks', 'list every reservation with its verdict: live, inuse, grace, leaked, corrupt, notready (with --policy reclaim-notready) or unknown', 'ipwarden leaks --network cbr0 --json')
    .action(async (opts: ReconcileCommandOptions) => {
      const m = await import('./leaks.ts');
      setCode(await m.run(opts, ctx));
    });
  reconcileCommand('gc', 'release leaked and corrupt reservations (each recorded in the audit log)', 'ipwarden gc --dry-run')
    .option('--dry-run', 'release nothing; list what would be released')
    .option('--audit-log <FILE>', 'audit log (default: .ipwarden-audit.log in each data dir)')
    .action(async (opts: ReconcileCommandOptions) => {
      const m = await import('./gc.ts');
      setCode(await m.run(opts, ctx));
    });

  // status / doctor (issue 4). Engines in ./status.ts and ./doctor.ts.
  program
    .command('status')
    .description('addresses per network and range set: capacity, reserved, live, grace, leaked, corrupt, free')
    .option('--cni-conf-dir <DIR>', 'CNI configuration directory', '/etc/cni/net.d')
    .option('--data-dir <DIR>', 'data dir for every network (default: each config\'s ipam.dataDir; /var/lib/cni/networks without configs)')
    .option('--network <NAME>', 'only this network')
    .option('--runtime-endpoint <URL>', 'CRI socket (default: $CONTAINER_RUNTIME_ENDPOINT, else containerd, else CRI-O)')
    .option('--grace <DUR>', 'unowned files younger than this are "grace", not "leaked" (Go duration)', '5m')
    .option('--json', 'print the documented JSON report')
    .option('--html <FILE>', 'also write a self-contained HTML page with an address map of every range set (FILE "-": print only the page on stdout)')
    .addHelpText('after', '\nExamples:\n  ipwarden status\n  ipwarden status --network cbr0 --json\n  ipwarden status --html /tmp/addresses.html\n')
    .action(async (opts: StatusOptions) => {
      const m = await import('./status.ts');
      setCode(await m.run(opts, ctx));
    });
  program
    .command('doctor')
    .description('inspect the node and print findings (severity, evidence, fix); exit 1 when any is an error')
    .option('--cni-conf-dir <DIR>', 'CNI configuration directory', '/etc/cni/net.d')
    .option('--data-dir <DIR>', 'data dir for every network (default: each config\'s ipam.dataDir; /var/lib/cni/networks without configs)')
    .option('--cni-bin-dir <DIRS>', 'CNI plugin directories, colon-separated, repeatable (default: /opt/cni/bin:/usr/lib/cni)', collectDirs)
    .option('--runtime-endpoint <URL>', 'CRI socket (default: $CONTAINER_RUNTIME_ENDPOINT, else containerd, else CRI-O)')
    .option('--grace <DUR>', 'unowned files younger than this are "grace", not "leaked" (Go duration)', '5m')
    .option('--json', 'print the findings as JSON')
    .addHelpText('after', '\nExamples:\n  ipwarden doctor\n  ipwarden doctor --cni-bin-dir /opt/cni/bin --json\n')
    .action(async (opts: DoctorOptions) => {
      const m = await import('./doctor.ts');
      setCode(await m.run(opts, ctx));
    });

  // pool (issue 11): cluster pools on etcd. Engine in src/pool/ (through src/pool/index.ts).
  const pool = program.command('pool').description('cluster pools on etcd: status, leaks, remove-node (docs/cluster.md)');
  const etcdFlags = (c: Command): Command =>
    c
      .requiredOption('--pool <NAME>', 'required: the pool (ipam.pool.name)')
      .requiredOption('--etcd-endpoints <URLS>', 'required: etcd endpoints, comma-separated (http://HOST:PORT or https://HOST:PORT)')
      .option('--etcd-prefix <P>', 'key prefix (ipam.pool.etcd.prefix)', '/ipwarden')
      .option('--etcd-ca <FILE>', 'CA of the etcd servers (PEM; required with https://)')
      .option('--etcd-cert <FILE>', 'client certificate (PEM)')
      .option('--etcd-key <FILE>', 'client key (PEM)')
      .option('--etcd-credentials <FILE>', 'etcd user and password, a JSON file {"user","password"} (ipam.pool.etcd.credentials; read under the trust rules)')
      .option('--json', 'print the documented JSON');
  etcdFlags(pool.command('status').description('blocks per node, usage and free addresses cluster-wide'))
    .option('--html', 'print a self-contained HTML page instead of the table (with --out: write it to FILE)')
    .option('--out <FILE>', 'with --html: write the page to FILE (the table or --json still go to stdout)')
    .addHelpText('after', '\nExamples:\n  ipwarden pool status --pool net1-pool --etcd-endpoints http://10.0.0.5:2379\n  ipwarden pool status --pool net1-pool --etcd-endpoints http://10.0.0.5:2379 --json\n  ipwarden pool status --pool net1-pool --etcd-endpoints http://10.0.0.5:2379 --html --out /tmp/pool.html\n')
    .action(async (opts: PoolOptions) => {
      const m = await import('./pool.ts');
      setCode(await m.runStatus(opts, ctx));
    });
  etcdFlags(pool.command('leaks').description("this node's attachments in the pool that its runtime and kernel no longer show (lists only)"))
    .option('--node <NODE>', 'the node (default: $NODE_NAME, else the host name); run it on that node')
    .option('--runtime-endpoint <URL>', 'CRI socket (default: $CONTAINER_RUNTIME_ENDPOINT, else containerd, else CRI-O)')
    .option('--grace <DUR>', 'attachments younger than this are "grace" (Go duration)', '5m')
    .addHelpText('after', '\nExamples:\n  ipwarden pool leaks --pool net1-pool --etcd-endpoints http://10.0.0.5:2379\n')
    .action(async (opts: PoolOptions) => {
      const m = await import('./pool.ts');
      setCode(await m.runLeaks(opts, ctx));
    });
  etcdFlags(pool.command('remove-node').argument('<NODE>', 'the node that is gone').description("reclaim a gone node's blocks: mark them pendingRelease (the node vetoes if it returns), then --finish"))
    .option('--finish', 'after the veto window: release what the node held and delete its emptied blocks')
    .option('--force', "step 1: act although the node's heartbeat is live, or no ipwarden daemon has ever served it (it cannot veto while idle)")
    .addHelpText('after', '\nExamples:\n  ipwarden pool remove-node worker-7 --pool net1-pool --etcd-endpoints http://10.0.0.5:2379\n  ipwarden pool remove-node worker-7 --pool net1-pool --etcd-endpoints http://10.0.0.5:2379 --finish\n')
    .action(async (node: string, opts: PoolOptions) => {
      const m = await import('./pool.ts');
      setCode(await m.runRemoveNode(node, opts, ctx));
    });

  // daemon (issue 9): flags → DaemonOptions here (./daemon.ts), the daemon itself is injected.
  program
    .command('daemon')
    .description('serve the CNI plugin over a unix socket for the exec shim (node agent; runs until SIGTERM)')
    .option('--socket <PATH>', 'plugin socket (its directory is created 0700 if missing)', '/run/ipwarden/plugin.sock')
    .option('--interval <DUR>', 'reconcile interval (Go duration)', '1m')
    .option('--metrics-address <HOST:PORT>', 'where Prometheus metrics are served', '127.0.0.1:9617')
    .option('--health-address <HOST:PORT>', "a listener of its own for /healthz and /readyz (the kubelet's probes; the DaemonSet: 127.0.0.1:9618)")
    .option('--log-level <LEVEL>', 'fatal, error, warn, info, debug, trace or silent (JSON lines on stderr)', 'info')
    .option('--data-dir <DIR>', 'host-local data dir holding one directory per network', '/var/lib/cni/networks')
    .option('--network <NAME>', 'only this network (default: every network directory)')
    .option('--runtime-endpoint <URL>', 'CRI socket (default: $CONTAINER_RUNTIME_ENDPOINT, else containerd, else CRI-O)')
    .option('--grace <DUR>', 'keep unowned files younger than this (Go duration)', '5m')
    .option('--policy <P>', 'conservative, or reclaim-notready', 'conservative')
    .option('--cni-conf-dir <DIR>', 'CNI configuration directory', '/etc/cni/net.d')
    .option('--audit-log <FILE>', 'audit log (default: <data-dir>/.ipwarden-audit.log)')
    .option('--pool-journal-dir <DIR>', 'journal of offline pool allocations, one directory per pool, read at start (default: /var/lib/cni/networks/.ipwarden-pool-offline)')
    .option('--cni-bin-dir <DIR>', 'the CNI bin directory install-cni wrote: watch the installed files there and reinstall them when they vanish or change (default: not watched)')
    .option('--warm-up <PAIRS>', 'ADD+DEL pairs the daemon sends itself at start, on a scratch network beside the socket, so the first burst of pods meets compiled code (0: off)', '2000')
    .addHelpText(
      'after',
      '\nEnvironment:\n' +
        "  NODE_NAME  this node's name in every cluster pool (its heartbeat, blocks and\n" +
        "             handles) unless a network's ipam.nodeName sets one; the DaemonSet\n" +
        "             sets it from spec.nodeName (unset: the node-name file beside the\n" +
        '             installed plugin, else the host name)\n' +
        '\nExamples:\n  ipwarden daemon\n  ipwarden daemon --socket /run/ipwarden/plugin.sock --log-level debug\n  ipwarden daemon --cni-bin-dir /host/opt/cni/bin\n',
    )
    .action(async (opts: DaemonCommandOptions) => {
      const m = await import('./daemon.ts');
      setCode(await m.run(opts, ctx, starters.daemon));
    });

  return program;
}

/** Commander collector for `--cni-bin-dir`: repeatable, each value colon-separated. */
function collectDirs(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), ...value.split(':').filter((d) => d !== '')];
}

/**
 * Run the CLI with `argv` (arguments only, no node/script). Resolves to the exit status:
 * 0 success, 1 failure, 2 usage error. Never calls process.exit. `starters` supplies the verbs
 * implemented above the CLI's layer (`daemon`); without one such a verb fails (exit 1) after its
 * flags were validated.
 */
export async function runMain(argv: readonly string[], rawCtx: CliContext = processContext(), starters: CliStarters = {}): Promise<number> {
  // Every human output goes through one filter: values from disk (an ifname may hold any byte but
  // whitespace, '/' and ':'), the runtime or configuration file names never reach the terminal
  // raw (issue 8.6). JSON is unchanged by it (see escapeTerminal).
  const ctx: CliContext = {
    ...rawCtx,
    stdout: (t) => rawCtx.stdout(escapeTerminal(t)),
    stderr: (t) => rawCtx.stderr(escapeTerminal(t)),
  };
  let code = 0;
  const program = build(
    ctx,
    (c) => {
      code = c;
    },
    starters,
  );
  try {
    if (argv.length === 0) {
      ctx.stdout(program.helpInformation());
      return 0;
    }
    await program.parseAsync([...argv], { from: 'user' });
    return code;
  } catch (e) {
    if (e instanceof CommanderError) {
      return e.exitCode === 0 ? 0 : 2;
    }
    if (e instanceof UsageError) {
      ctx.stderr(`ipwarden: ${e.message}\n`);
      return 2;
    }
    if (e instanceof AppError) {
      ctx.stderr(`ipwarden: ${e.message}${e.details !== undefined ? ` (${e.details})` : ''}\n`);
      return 1;
    }
    throw e;
  }
}
