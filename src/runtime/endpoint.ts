/**
 * Where the CRI runtime listens.
 *
 * Resolution order follows crictl and the kubelet: an explicit flag, then the
 * `CONTAINER_RUNTIME_ENDPOINT` environment variable, then the first socket that exists of
 * {@link DEFAULT_RUNTIME_ENDPOINTS} (containerd's, then CRI-O's default path).
 */
import { existsSync } from 'node:fs';
import { parseRuntimeEndpoint, type RuntimeEndpoint } from '../common/endpoint.ts';
import { AppError } from '../common/errors.ts';

/** Default sockets probed in order when no endpoint is configured (containerd, CRI-O). */
export const DEFAULT_RUNTIME_ENDPOINTS: readonly string[] = [
  '/run/containerd/containerd.sock',
  '/var/run/crio/crio.sock',
];

/** How the error of {@link resolveRuntimeEndpoint} begins when nothing is configured and no default socket exists. */
export const NO_RUNTIME_FOUND = 'no CRI runtime found';

/**
 * {@link RuntimeEndpoint} and {@link parseRuntimeEndpoint} are pure and live in the leaf module
 * `src/common/endpoint.ts` (the IPAM config validates `ipam.runtimeEndpoint` with it, and may not
 * import `src/runtime/`); re-exported here.
 */
export { parseRuntimeEndpoint, type RuntimeEndpoint };

/**
 * Picks the CRI endpoint: `flag` if given (non-empty), else `env.CONTAINER_RUNTIME_ENDPOINT`
 * if non-empty, else the first of {@link DEFAULT_RUNTIME_ENDPOINTS} for which `exists` is true.
 * A configured endpoint is returned even when its socket is missing (the client then reports
 * `RUNTIME_UNAVAILABLE` with the path), so a typo is never silently replaced by a default.
 *
 * @param flag    value of `--runtime-endpoint`, if any
 * @param env     environment to read (injected for tests)
 * @param exists  path probe (injected for tests)
 * @throws AppError `USAGE` for a malformed endpoint; `RUNTIME_UNAVAILABLE` (retryable) when
 *   nothing is configured and no default socket exists.
 */
export function resolveRuntimeEndpoint(
  flag?: string,
  env: NodeJS.ProcessEnv = process.env,
  exists: (path: string) => boolean = existsSync,
): RuntimeEndpoint {
  if (flag !== undefined && flag !== '') return parseRuntimeEndpoint(flag);
  const fromEnv = env['CONTAINER_RUNTIME_ENDPOINT'];
  if (fromEnv !== undefined && fromEnv !== '') return parseRuntimeEndpoint(fromEnv);
  for (const p of DEFAULT_RUNTIME_ENDPOINTS) {
    if (exists(p)) return { url: `unix://${p}`, path: p };
  }
  throw new AppError(
    'RUNTIME_UNAVAILABLE',
    `${NO_RUNTIME_FOUND}: none of ${DEFAULT_RUNTIME_ENDPOINTS.join(', ')} exists; set --runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT`,
    { retryable: true },
  );
}
