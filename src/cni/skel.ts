/**
 * The CNI protocol edge (house style 5), modelled on libcni's `pkg/skel` dispatcher:
 * environment + stdin in, exactly one JSON document (result, version info or error) on stdout,
 * exit status 0 or 1. All I/O is injected through {@link PluginIO} so tests drive it in-process.
 *
 * Facts (containernetworking/cni pkg/skel/skel.go, pkg/utils/utils.go; SPEC.md @spec-v1.1.0 §2):
 * - required env per command: CNI_COMMAND always; CNI_CONTAINERID and CNI_IFNAME for
 *   ADD/CHECK/DEL; CNI_NETNS for ADD/CHECK; CNI_PATH for ADD/CHECK/DEL/GC/STATUS. Missing ones
 *   → code 4 `required env variables [A,B] missing`.
 * - the config must decode (code 6 `error unmarshall network config: ...`) and carry a valid
 *   `name` (code 7); the container ID and ifname are validated (codes 3/4) before any handler.
 * - `cniVersion` must be supported (code 1 `incompatible CNI versions`); CHECK needs ≥ 0.4.0,
 *   GC and STATUS need ≥ 1.1.0 (code 1 `config version does not allow <CMD>`).
 * - every error is printed once as `{cniVersion, code, msg, details?}`; anything that is not an
 *   {@link AppError} becomes code 999. skel's `types.Error` prints no `cniVersion`; SPEC.md §Error
 *   asks for "the same value as provided by the configuration", so ipwarden reads stdin before it
 *   checks the env and every error carries the config's version ({@link errorVersion}).
 */
import { AppError, errnoCode } from '../common/errors.ts';
import { validateContainerId, validateIfname, validateNetworkName } from '../ipam/config.ts';
import { encodeResult, formatJSON, type IPAMResult } from './result.ts';
import { compareVersions, CURRENT_VERSION, isSupported, SUPPORTED_VERSIONS } from './version.ts';

/** Injected process I/O. */
export interface PluginIO {
  readonly env: Readonly<Record<string, string | undefined>>;
  /** Read all of stdin (bytes). */
  readStdin(): Promise<Uint8Array>;
  /** Write to stdout (the protocol channel: one JSON document per invocation). */
  stdout(text: string): void;
  /** Write to stderr (free-form diagnostics). */
  stderr(text: string): void;
}

/** The CNI commands ipwarden implements. */
export type CniCommand = 'ADD' | 'DEL' | 'CHECK' | 'GC' | 'STATUS' | 'VERSION';

/** Arguments of one invocation, after env validation. Empty strings for absent optional vars. */
export interface CmdArgs {
  readonly command: CniCommand;
  readonly containerId: string;
  readonly netns: string;
  readonly ifname: string;
  /** Raw `CNI_ARGS`. */
  readonly args: string;
  readonly path: string;
  readonly stdinData: Uint8Array;
  /** The config's `cniVersion` (`0.1.0` when absent, as libcni's decoder does). */
  readonly cniVersion: string;
}

/** Command handlers: return a result or throw. */
export interface PluginHandlers {
  add(a: CmdArgs): Promise<IPAMResult>;
  del(a: CmdArgs): Promise<void>;
  check(a: CmdArgs): Promise<void>;
  gc(a: CmdArgs): Promise<void>;
  status(a: CmdArgs): Promise<void>;
}

const COMMANDS: readonly CniCommand[] = ['ADD', 'DEL', 'CHECK', 'GC', 'STATUS', 'VERSION'];

/** Which env vars each command requires (libcni skel `getCmdArgsFromEnv`, plus GC/STATUS of 1.1.0). */
const REQUIRED_ENV: ReadonlyArray<readonly [string, readonly CniCommand[]]> = [
  ['CNI_COMMAND', COMMANDS],
  ['CNI_CONTAINERID', ['ADD', 'CHECK', 'DEL']],
  ['CNI_NETNS', ['ADD', 'CHECK']],
  ['CNI_IFNAME', ['ADD', 'CHECK', 'DEL']],
  ['CNI_ARGS', []],
  ['CNI_PATH', ['ADD', 'CHECK', 'DEL', 'GC', 'STATUS']],
];

/** Minimum config version per command (skel: CHECK ≥ 0.4.0, GC/STATUS ≥ 1.1.0). */
const MIN_VERSION: Partial<Record<CniCommand, string>> = { CHECK: '0.4.0', GC: '1.1.0', STATUS: '1.1.0' };

/**
 * Run one plugin invocation. Returns the exit status (0 success, 1 error); never throws and never
 * calls `process.exit`. Prints exactly one JSON document on stdout, except for successful
 * DEL/CHECK/GC/STATUS, which print nothing (SPEC.md).
 */
export async function pluginMain(h: PluginHandlers, io: PluginIO): Promise<number> {
  /** The version every error document carries: the config's when known (SPEC.md §Error). */
  let errVersion = CURRENT_VERSION;
  try {
    const env = (name: string): string => io.env[name] ?? '';
    const cmd = env('CNI_COMMAND');
    // stdin first, so that the env errors below carry the config's version too; a read failure
    // is reported after them, in skel's order (env, then stdin).
    let stdinData: Uint8Array | null = null;
    let readError: unknown = null;
    try {
      stdinData = await readStdin(io);
    } catch (e) {
      readError = e;
    }
    const parsed = stdinData === null ? null : parseStdin(stdinData);
    if (parsed !== null) errVersion = errorVersion(parsed);
    const missing = REQUIRED_ENV.filter(
      ([name, cmds]) => env(name) === '' && (name === 'CNI_COMMAND' || (cmds as readonly string[]).includes(cmd)),
    ).map(([name]) => name);
    if (missing.length > 0) {
      throw new AppError('IPAM_INVALID_ENV', `required env variables [${missing.join(',')}] missing`);
    }
    if (!(COMMANDS as readonly string[]).includes(cmd)) {
      throw new AppError('IPAM_INVALID_ENV', `unknown CNI_COMMAND: ${cmd}`);
    }
    const command = cmd as CniCommand;
    if (stdinData === null || parsed === null) throw readError;

    if (command === 'VERSION') {
      // SPEC.md §VERSION: the answer carries the input's cniVersion when we speak it.
      const asked = peekVersion(parsed);
      io.stdout(versionJSON(asked !== null && isSupported(asked) ? asked : CURRENT_VERSION));
      return 0;
    }

    const cniVersion = decodeConfigHeader(parsed);
    const a: CmdArgs = {
      command,
      containerId: env('CNI_CONTAINERID'),
      netns: env('CNI_NETNS'),
      ifname: env('CNI_IFNAME'),
      args: env('CNI_ARGS'),
      path: env('CNI_PATH'),
      stdinData,
      cniVersion,
    };
    if (command === 'ADD' || command === 'DEL' || command === 'CHECK') {
      validateContainerId(a.containerId);
      validateIfname(a.ifname);
    }
    if (!isSupported(cniVersion)) {
      throw new AppError(
        'IPAM_INCOMPATIBLE_VERSION',
        'incompatible CNI versions',
        { details: `config is "${cniVersion}", plugin supports [${SUPPORTED_VERSIONS.map((v) => `"${v}"`).join(' ')}]` },
      );
    }
    const min = MIN_VERSION[command];
    if (min !== undefined && compareVersions(cniVersion, min) < 0) {
      throw new AppError('IPAM_INCOMPATIBLE_VERSION', `config version does not allow ${command}`);
    }

    switch (command) {
      case 'ADD': {
        const result = await h.add(a);
        io.stdout(formatJSON(encodeResult(result, cniVersion)));
        return 0;
      }
      case 'DEL':
        await h.del(a);
        return 0;
      case 'CHECK':
        await h.check(a);
        return 0;
      case 'GC':
        await h.gc(a);
        return 0;
      case 'STATUS':
        await h.status(a);
        return 0;
    }
  } catch (e) {
    io.stdout(formatJSON(toCniError(e, errVersion)));
    if (!(e instanceof AppError)) io.stderr(`ipwarden: internal error: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    return 1;
  }
}

/**
 * The VERSION answer for `cniVersion`, byte for byte as libcni's `PluginInfo.Encode` writes it
 * (Go's `json.Encoder`): compact JSON followed by one newline,
 * `{"cniVersion":"1.0.0","supportedVersions":["0.1.0",…,"1.1.0"]}\n`. ADD results and error
 * documents are different: skel prints them indented by 4 spaces and with no trailing newline
 * (`types.PrintResult` / `Error.Print`, json.MarshalIndent), as {@link formatJSON} does.
 */
export function versionJSON(cniVersion: string): string {
  return `${JSON.stringify({ cniVersion, supportedVersions: SUPPORTED_VERSIONS })}\n`;
}

/**
 * The text a plugin prints on stderr when run without `CNI_COMMAND` (an operator typing its path),
 * as libcni's skel does (`pluginMain`: the "about" string, then the protocol versions), exit 0:
 * `CNI ipwarden plugin version <version>\nCNI protocol versions supported: 0.1.0, …, 1.1.0\n`.
 * `version`: the ipwarden release (e.g. `0.1.0`).
 */
export function aboutText(version: string): string {
  return `CNI ipwarden plugin version ${version}\nCNI protocol versions supported: ${SUPPORTED_VERSIONS.join(', ')}\n`;
}

async function readStdin(io: PluginIO): Promise<Uint8Array> {
  try {
    return await io.readStdin();
  } catch (e) {
    throw new AppError('IPAM_IO', `error reading from stdin: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/** stdin decoded once: the JSON value, or the parse error (reported by {@link decodeConfigHeader}). */
type ParsedStdin = { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly error: unknown };

function parseStdin(stdin: Uint8Array): ParsedStdin {
  try {
    return { ok: true, value: JSON.parse(Buffer.from(stdin).toString('utf8')) as unknown };
  } catch (e) {
    return { ok: false, error: e };
  }
}

/** The JSON object of stdin, or null when stdin is not one. */
function asObject(p: ParsedStdin): Record<string, unknown> | null {
  if (!p.ok || typeof p.value !== 'object' || p.value === null || Array.isArray(p.value)) return null;
  return p.value as Record<string, unknown>;
}

/** `cniVersion` of a VERSION request, or null when absent/undecodable (VERSION never fails on it). */
function peekVersion(p: ParsedStdin): string | null {
  const v = asObject(p)?.['cniVersion'];
  return typeof v === 'string' ? v : null;
}

/**
 * The `cniVersion` of an error document (SPEC.md §Error: "the same value as provided by the
 * configuration"): the config's version as {@link decodeConfigHeader} reads it (`0.1.0` when
 * absent or empty) when stdin is a JSON object and that version is one of
 * {@link SUPPORTED_VERSIONS}; {@link CURRENT_VERSION} otherwise — stdin unreadable or not a JSON
 * object, `cniVersion` not a string, or a version ipwarden does not speak (itself code 1).
 */
function errorVersion(p: ParsedStdin): string {
  const o = asObject(p);
  if (o === null) return CURRENT_VERSION;
  const v = o['cniVersion'] === undefined || o['cniVersion'] === '' ? '0.1.0' : o['cniVersion'];
  return typeof v === 'string' && isSupported(v) ? v : CURRENT_VERSION;
}

/**
 * skel's `validateConfig` + version decode: the stdin must be a JSON object with a valid `name`;
 * returns its `cniVersion` (`0.1.0` when absent, libcni `ConfigDecoder`).
 */
function decodeConfigHeader(p: ParsedStdin): string {
  if (!p.ok) {
    const e = p.error;
    throw new AppError('IPAM_DECODE', `error unmarshall network config: ${e instanceof Error ? e.message : String(e)}`);
  }
  const o = asObject(p);
  if (o === null) {
    throw new AppError('IPAM_DECODE', 'error unmarshall network config: not a JSON object');
  }
  const rec = o;
  if (rec['name'] !== undefined && typeof rec['name'] !== 'string') {
    throw new AppError('IPAM_DECODE', 'error unmarshall network config: "name" must be a string');
  }
  const name = (rec['name'] as string | undefined) ?? '';
  if (name === '') throw new AppError('IPAM_INVALID_CONFIG', 'missing network name');
  validateNetworkName(name);
  const v = rec['cniVersion'];
  if (v === undefined || v === '') return '0.1.0';
  if (typeof v !== 'string') throw new AppError('IPAM_DECODE', 'error unmarshall network config: "cniVersion" must be a string');
  return v;
}

/** The spec error object for any thrown value; AppErrors keep their code, others become 999. */
export function toCniError(e: unknown, cniVersion: string): Record<string, unknown> {
  if (e instanceof AppError) {
    const o: Record<string, unknown> = { cniVersion, code: e.cniCode, msg: e.message };
    if (e.details !== undefined && e.details !== '') o['details'] = e.details;
    return o;
  }
  const code = errnoCode(e);
  const msg = e instanceof Error ? e.message : String(e);
  return { cniVersion, code: code === 'EIO' ? 5 : 999, msg };
}
