/**
 * The text form of a CRI runtime endpoint (`unix:///path` or `/path`), parsed purely. A leaf
 * module: the IPAM config (`ipam.runtimeEndpoint`), the runtime client and the CLI share it.
 * Resolution (flag, `CONTAINER_RUNTIME_ENDPOINT`, default sockets) is I/O and stays in
 * `src/runtime/endpoint.ts`.
 */
import { AppError } from './errors.ts';

/** A resolved CRI endpoint: `url` is `unix://` + `path`, the form gRPC and error messages use. */
export interface RuntimeEndpoint {
  /** `unix:///abs/path`. */
  readonly url: string;
  /** Absolute filesystem path of the unix socket. */
  readonly path: string;
}

/**
 * Parses `unix:///path` or a bare absolute `/path` into a {@link RuntimeEndpoint}.
 *
 * @throws AppError `USAGE` for an empty value, another scheme (`tcp://`, `npipe://`) or a
 *   relative path — ipwarden only talks to local unix sockets.
 */
export function parseRuntimeEndpoint(value: string): RuntimeEndpoint {
  const v = value.trim();
  let path: string;
  if (v.startsWith('unix://')) path = v.slice('unix://'.length);
  else if (v.startsWith('/')) path = v;
  else if (v === '') throw new AppError('USAGE', 'runtime endpoint is empty');
  else {
    throw new AppError(
      'USAGE',
      `unsupported runtime endpoint ${JSON.stringify(value)}: want unix:///path/to/socket or /path/to/socket`,
    );
  }
  if (!path.startsWith('/')) {
    throw new AppError(
      'USAGE',
      `unsupported runtime endpoint ${JSON.stringify(value)}: the socket path must be absolute`,
    );
  }
  return { url: `unix://${path}`, path };
}
