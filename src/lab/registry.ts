/**
 * A real container registry on loopback for the lab: Debian's `docker-registry` (the CNCF
 * distribution registry, 2.8) run as a plain child process on `127.0.0.1:<free port>`, plain HTTP
 * (no TLS, no auth), its storage in a temporary directory. `npm run image -- --push` pushes the
 * image index to it with skopeo; the lab's containerd pulls from it by digest
 * (`ctr images pull --plain-http`), as a node pulls from an operator's registry.
 *
 * Stopped (SIGTERM, then SIGKILL after 10 s, by pid) and its directory removed by
 * {@link LocalRegistry.stop}; a registry whose process dies while starting is retried on another
 * port (a port taken between the probe and the bind).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync, openSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort, pollUntil } from './daemonset.ts';
import { isAlive, signal, waitGone } from './proc.ts';

/** The registry's binary (Debian package `docker-registry`). */
export const REGISTRY_BINARY = '/usr/bin/docker-registry';

/** A running loopback registry. */
export interface LocalRegistry {
  /** `127.0.0.1:<port>`: the registry part of an image reference. */
  readonly address: string;
  readonly pid: number;
  /** Its temporary directory (config, storage, log). */
  readonly dir: string;
  /** The log's last lines (for error messages). */
  logTail(): string;
  /** Stops the process and removes the directory; idempotent. Rejects when the process outlives SIGKILL. */
  stop(): Promise<void>;
}

/** Why the registry cannot run here, or undefined. */
export function registryUnavailableReason(): string | undefined {
  return existsSync(REGISTRY_BINARY) ? undefined : `no ${REGISTRY_BINARY} (Debian: apt-get install -y docker-registry)`;
}

/**
 * Starts a registry on `127.0.0.1:<free port>` with its storage in a new temporary directory and
 * waits (up to 30 s) until `GET /v2/` answers 200.
 * @throws Error when the binary is missing, or three starts in a row fail (with the log's tail).
 */
export async function startRegistry(): Promise<LocalRegistry> {
  const why = registryUnavailableReason();
  if (why !== undefined) throw new Error(why);
  let last = '';
  for (let attempt = 1; attempt <= 3; attempt++) {
    const dir = mkdtempSync(join(tmpdir(), 'ipwarden-registry-'));
    const port = await freePort();
    const address = `127.0.0.1:${port}`;
    const config = join(dir, 'config.yml');
    // distribution's configuration (docs/configuration.md of distribution 2.8): filesystem
    // storage, deletes allowed, the HTTP listener on loopback only, no TLS.
    writeFileSync(
      config,
      [
        'version: 0.1',
        'log:',
        '  level: info',
        '  accesslog:',
        '    disabled: true',
        'storage:',
        '  filesystem:',
        `    rootdirectory: ${join(dir, 'storage')}`,
        '  delete:',
        '    enabled: true',
        'http:',
        `  addr: ${address}`,
        'health:',
        '  storagedriver:',
        '    enabled: false',
        '',
      ].join('\n'),
    );
    const logFile = join(dir, 'registry.log');
    const fd = openSync(logFile, 'a');
    const child = spawn(REGISTRY_BINARY, ['serve', config], { stdio: ['ignore', fd, fd] });
    closeSync(fd);
    const pid = child.pid;
    if (pid === undefined) {
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`${REGISTRY_BINARY}: cannot start it`);
    }
    let exited = false;
    child.once('exit', () => {
      exited = true;
    });
    const logTail = (): string => {
      try {
        return readFileSync(logFile, 'utf8').trim().split('\n').slice(-10).join('\n');
      } catch {
        return '';
      }
    };
    let stopped: Promise<void> | undefined;
    const stop = (): Promise<void> =>
      (stopped ??= (async () => {
        if (isAlive(pid)) {
          signal(pid, 'SIGTERM');
          if ((await waitGone([pid], 10)).length > 0) {
            signal(pid, 'SIGKILL');
            if ((await waitGone([pid], 5)).length > 0) throw new Error(`docker-registry pid ${pid} outlived SIGKILL`);
          }
        }
        rmSync(dir, { recursive: true, force: true });
      })());
    try {
      await pollUntil(`docker-registry on ${address} (GET /v2/)`, 30, async () => {
        if (exited) throw new Error(`docker-registry exited while starting:\n${logTail()}`);
        const ok = await fetch(`http://${address}/v2/`).then((r) => r.status === 200, () => false);
        return ok ? true : undefined;
      });
      return { address, pid, dir, logTail, stop };
    } catch (e) {
      last = e instanceof Error ? e.message : String(e);
      await stop();
    }
  }
  throw new Error(`docker-registry did not start in 3 attempts: ${last}`);
}
