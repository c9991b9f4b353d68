/**
 * Plugin mode entry: wires the command handlers to the host-local compatible file store and the
 * real process streams. Loaded only when `CNI_COMMAND` is set, and loads only what ADD/DEL need.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { openFileStore } from '../store/file/file-store.ts';
import { makeHandlers, type PluginDeps } from './commands.ts';
import { pluginMain, type PluginIO } from './skel.ts';

/** Production dependencies: the file store under `dataDir`, real file reads. */
export const fileDeps: PluginDeps = {
  openStore: async ({ dataDir, network, create }) =>
    // DEL/GC/CHECK on a network that has no directory have nothing to do: create nothing.
    !create && !existsSync(join(dataDir, network)) ? null : openFileStore({ dataDir, network }),
  readTextFile: (path) => readFileSync(path, 'utf8'),
};

function readAll(stream: NodeJS.ReadableStream): Promise<Uint8Array> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    stream.on('data', (c: Buffer) => chunks.push(c));
    stream.on('end', () => resolve(Buffer.concat(chunks)));
    stream.on('error', reject);
  });
}

/** The real process I/O. stdout carries only the protocol document. */
export function processIO(): PluginIO {
  return {
    env: process.env,
    readStdin: () => readAll(process.stdin),
    stdout: (t) => process.stdout.write(t),
    stderr: (t) => process.stderr.write(t),
  };
}

/** Run the plugin against the real process; resolves to the exit status. */
export function runPlugin(io: PluginIO = processIO(), deps: PluginDeps = fileDeps): Promise<number> {
  return pluginMain(makeHandlers(deps), io);
}
