/**
 * The IP helpers live in the leaf module `src/common/ip.ts` (the stores, the node readers and the
 * reconciler use them too, and may not import `src/ipam/`). Re-exported here so the IPAM modules
 * and existing importers keep their paths; new code imports `../common/ip.ts`.
 */
export * from '../common/ip.ts';
