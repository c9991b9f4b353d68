/**
 * Program entry shared by `bin/ipwarden` and the installed CNI executable: plugin mode when
 * `CNI_COMMAND` is set (the CNI spec's invocation), the operator CLI otherwise — except that the
 * installed plugin run alone (no `CNI_COMMAND`, no argument; the shim then sets
 * `IPWARDEN_PATH=plugin-about`) prints the plugin's "about" text on stderr and exits 0, as
 * libcni's skel does. Each side is loaded lazily so the plugin's hot path does not evaluate the
 * CLI or the CRI client.
 */

/** Run ipwarden with `argv` (without node and script); resolves to the exit status. */
export async function main(argv: readonly string[], env: Readonly<Record<string, string | undefined>>): Promise<number> {
  if ((env['CNI_COMMAND'] ?? '') !== '') {
    const { fileDepsWith, runPlugin } = await import('./cni/plugin.ts');
    return runPlugin(
      fileDepsWith(
        async () => (await import('./cold.ts')).criHeal,
        async () => (await import('./cold.ts')).poolHooks,
      ),
    );
  }
  if (argv.length === 0 && env['IPWARDEN_PATH'] === ABOUT_PATH) {
    // The installed plugin (DIR/ipwarden, the shim) typed alone: skel's "about" text, not the CLI's usage.
    const [{ aboutText }, { IPWARDEN_VERSION }] = await Promise.all([import('./cni/skel.ts'), import('./cni/version.ts')]);
    process.stderr.write(aboutText(IPWARDEN_VERSION));
    return 0;
  }
  const { runMain } = await import('./cold.ts');
  return runMain(argv);
}

/**
 * Value of `IPWARDEN_PATH` with which the exec shim (native/shim.c) runs the standalone when the
 * shim itself was run without `CNI_COMMAND` and without arguments: print the plugin's "about" text
 * on stderr (docs/daemon.md). Any other run without `CNI_COMMAND` is the CLI.
 */
const ABOUT_PATH = 'plugin-about';

void main(process.argv.slice(2), process.env).then(
  (code) => {
    // Plugin mode: the reply is written (synchronously); end now, so runtime calls abandoned at
    // a heal deadline (grpc-js does not cancel calls on close) cannot keep the runtime waiting.
    if ((process.env['CNI_COMMAND'] ?? '') !== '') process.exit(code);
    process.exitCode = code;
  },
  (e: unknown) => {
    const text = e instanceof Error ? (e.stack ?? e.message) : String(e);
    // In plugin mode stdout belongs to the protocol: even a failure to start answers with the
    // spec's error document (code 999), so the runtime reports it instead of "no error message".
    if ((process.env['CNI_COMMAND'] ?? '') !== '') {
      process.stdout.write(`${JSON.stringify({ code: 999, msg: `ipwarden failed to start: ${e instanceof Error ? e.message : String(e)}` })}\n`);
    }
    process.stderr.write(`ipwarden: ${text}\n`);
    process.exitCode = 1;
  },
);
