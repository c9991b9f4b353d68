/**
 * Program entry shared by `bin/ipwarden` and the installed CNI executable: plugin mode when
 * `CNI_COMMAND` is set (the CNI spec's invocation), the operator CLI otherwise. Each side is
 * loaded lazily so the plugin's hot path does not evaluate the CLI or the CRI client.
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
  const { runMain } = await import('./cold.ts');
  return runMain(argv);
}

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
