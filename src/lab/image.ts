/**
 * Builds the lab's sandbox ("pause") image as an OCI image-layout tar archive, without any
 * registry: compile `pause.c` statically, pack it as one uncompressed layer, write config,
 * manifest, `index.json` (with `io.containerd.image.name` so `ctr images import` names it) and
 * `oci-layout`, then tar the layout. Recipe from shared/reference/containerd-lab.md.
 *
 * Needs `gcc` (with static libc) and GNU `tar` on PATH.
 */
import { createHash } from 'node:crypto';
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { run } from './proc.ts';

/** Fully qualified name of the lab sandbox image; `localhost/` keeps any pull attempt on loopback. */
export const PAUSE_IMAGE = 'localhost/ipwarden-pause:1';

/** Path of the pause program's C source. */
export const PAUSE_SOURCE = fileURLToPath(new URL('./pause.c', import.meta.url));

/** The image archive written by {@link buildPauseImage}. */
export interface PauseImage {
  /** Path of the OCI image-layout tar, for `ctr -n k8s.io images import`. */
  archive: string;
  /** Image reference it is imported as ({@link PAUSE_IMAGE}). */
  name: string;
}

function ociArch(): string {
  switch (process.arch) {
    case 'x64':
      return 'amd64';
    case 'arm64':
      return 'arm64';
    default:
      return process.arch;
  }
}

function sha256(data: Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

/**
 * Compiles the pause program and writes the image archive under `dir` (created if missing).
 * @throws Error with the compiler's/tar's stderr when a tool fails.
 */
export async function buildPauseImage(dir: string): Promise<PauseImage> {
  const rootfs = join(dir, 'rootfs');
  const oci = join(dir, 'oci');
  const blobs = join(oci, 'blobs', 'sha256');
  mkdirSync(rootfs, { recursive: true });
  mkdirSync(blobs, { recursive: true });
  const bin = join(dir, 'pause');
  await run('gcc', ['-static', '-Os', '-s', '-o', bin, PAUSE_SOURCE]);
  copyFileSync(bin, join(rootfs, 'pause'));

  const layerPath = join(dir, 'layer.tar');
  await run('tar', ['--sort=name', '--mtime=@0', '--owner=0', '--group=0', '--numeric-owner', '-C', rootfs, '-cf', layerPath, 'pause']);
  const layer = readFileSync(layerPath);
  const blob = (data: Buffer): { digest: string; size: number } => {
    const hex = sha256(data);
    writeFileSync(join(blobs, hex), data);
    return { digest: `sha256:${hex}`, size: data.length };
  };
  const layerDesc = blob(layer);
  const arch = ociArch();
  const config = Buffer.from(
    JSON.stringify({
      architecture: arch,
      os: 'linux',
      config: { Entrypoint: ['/pause'] },
      rootfs: { type: 'layers', diff_ids: [layerDesc.digest] },
    }),
  );
  const configDesc = blob(config);
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...configDesc },
      layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar', ...layerDesc }],
    }),
  );
  const manifestDesc = blob(manifest);
  const tag = PAUSE_IMAGE.slice(PAUSE_IMAGE.lastIndexOf(':') + 1);
  writeFileSync(
    join(oci, 'index.json'),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [
        {
          mediaType: 'application/vnd.oci.image.manifest.v1+json',
          ...manifestDesc,
          platform: { architecture: arch, os: 'linux' },
          annotations: { 'io.containerd.image.name': PAUSE_IMAGE, 'org.opencontainers.image.ref.name': tag },
        },
      ],
    }),
  );
  writeFileSync(join(oci, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  const archive = join(dir, 'pause-oci.tar');
  await run('tar', ['-C', oci, '-cf', archive, 'oci-layout', 'index.json', 'blobs']);
  return { archive, name: PAUSE_IMAGE };
}
