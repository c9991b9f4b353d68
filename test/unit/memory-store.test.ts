/** MemoryStore (the fake of src/store/memory/memory-store.ts) passes the one Store contract suite. */
import { MemoryStore } from '../../src/store/memory/memory-store.ts';
import { runStoreContract } from './store-contract.ts';

runStoreContract('MemoryStore', async () => {
  const store = new MemoryStore('net1');
  return { store, plant: async (ip, owner) => void store.seed(ip, owner) };
});
