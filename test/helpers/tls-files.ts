/**
 * TLS files for tests of etcd over TLS (docs/cluster.md "TLS"): a CA and a server and a client
 * certificate signed by it, made with the installed `openssl` (Debian `openssl`) in a directory
 * the test owns. Keys are EC P-256 (fast to make); the server certificate names `127.0.0.1`
 * (subjectAltName IP), which is what the etcd of test/helpers/etcd-cluster.ts listens on; both
 * certificates carry serverAuth and clientAuth (etcd checks the client's extended key usage).
 * Valid for 2 days.
 *
 * {@link installTlsSet} copies a set to fixed paths the way a rotation does on a node: each file
 * written beside its final name and renamed over it (the paths keep their names, their inodes
 * change), so an etcd restarted on those paths and an ipwarden reading them see the new set.
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** The installed openssl. */
export const OPENSSL_BIN = '/usr/bin/openssl';

/** True when openssl is installed. */
export function haveOpenssl(): boolean {
  return existsSync(OPENSSL_BIN);
}

/** One CA and the certificates it signed (PEM file paths). */
export interface TlsSet {
  readonly ca: string;
  readonly serverCert: string;
  readonly serverKey: string;
  readonly clientCert: string;
  readonly clientKey: string;
}

function openssl(args: string[], cwd: string): void {
  const r = spawnSync(OPENSSL_BIN, args, { cwd, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`openssl ${args.join(' ')}: exit ${r.status}: ${r.stderr}`);
}

/**
 * Make a CA named `name` and a server and a client certificate signed by it, as
 * `<dir>/<name>-{ca,ca-key,server,server-key,client,client-key}.pem` (keys 0600). Throws when
 * openssl fails.
 */
export function makeTlsSet(dir: string, name: string): TlsSet {
  const f = (x: string): string => join(dir, `${name}-${x}.pem`);
  openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', f('ca-key'), '-out', f('ca'), '-days', '2', '-subj', `/CN=ipwarden test CA ${name}`], dir);
  const ext = join(dir, `${name}-ext.cnf`);
  writeFileSync(ext, 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n');
  for (const who of ['server', 'client']) {
    const csr = join(dir, `${name}-${who}.csr`);
    openssl(['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', f(`${who}-key`), '-out', csr, '-subj', `/CN=${who}`], dir);
    openssl(['x509', '-req', '-in', csr, '-CA', f('ca'), '-CAkey', f('ca-key'), '-CAcreateserial', '-out', f(who), '-days', '2', '-extfile', ext], dir);
  }
  return { ca: f('ca'), serverCert: f('server'), serverKey: f('server-key'), clientCert: f('client'), clientKey: f('client-key') };
}

/** Copy every file of `from` over the same member of `to`, each written beside it then renamed over it. */
export function installTlsSet(from: TlsSet, to: TlsSet): void {
  for (const k of ['ca', 'serverCert', 'serverKey', 'clientCert', 'clientKey'] as const) {
    const tmp = `${to[k]}.new`;
    copyFileSync(from[k], tmp);
    renameSync(tmp, to[k]);
  }
}
