/* Profiler unit tests: per-peer network timing (net.c; #included by test_plugin.c after its helpers). */

static void* proxy_op(void* ctx, void* parent, int pid, int peer, int send) {
  ncclProfilerEventDescr_v6_t d = {.type = ncclProfileProxyOp, .parentObj = parent,
                                   .proxyOp = {.pid = pid, .peer = peer, .isSend = send}};
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  return h;
}

/* At most DCCL_NET_PEERS (peer, direction) pairs per operation (the rest counted in the PEER records);
   a second proxy op to a peer folds into its entry; a PXN proxy op of another process is not decoded;
   a step handle used after its operation completed is counted and changes nothing. */
static int test_net_peers_and_stale(void) {
  clear_env();
  setenv("DYNAMICCL_EVENT_MASK", "94", 1);
  dccl_ctx_t* ctx = init6(0x9E7, 1, 16);
  TEST_ASSERT(ctx != NULL && ctx->net != NULL, "net tables with ProxyOp in the mask");
  ncclProfilerEventDescr_v6_t d = coll_descr(NULL, 5, "AllReduce", "ncclFloat32", 1000, 1);
  void* h = NULL;
  ncclProfiler_v6.startEvent(ctx, &h, &d);
  void* op[DCCL_NET_PEERS + 1];
  for (int i = 0; i <= DCCL_NET_PEERS; i++) op[i] = proxy_op(ctx, h, (int)getpid(), i, 1);
  TEST_ASSERT(op[DCCL_NET_PEERS - 1] != NULL && op[DCCL_NET_PEERS] == NULL, "the ninth pair is refused");
  TEST_ASSERT(proxy_op(ctx, h, (int)getpid(), 0, 1) != NULL, "a second op to peer 0");
  TEST_ASSERT(proxy_op(ctx, (void*)(uintptr_t)0xdead0000, (int)getpid() + 1, 0, 1) == NULL, "PXN: not ours");
  ncclProfilerEventDescr_v6_t sd = {.type = ncclProfileProxyStep, .parentObj = op[0]};
  void* step = NULL;
  ncclProfiler_v6.startEvent(ctx, &step, &sd);
  TEST_ASSERT(step != NULL, "step handle");
  ncclProfilerEventStateArgs_v6_t a = {.proxyStep = {.transSize = 4096}};
  ncclProfiler_v6.recordEventState(step, ncclProfilerProxyStepSendGPUWait, NULL);
  ncclProfiler_v6.recordEventState(step, ncclProfilerProxyStepSendWait, &a);
  ncclProfiler_v6.stopEvent(step);
  ncclProfiler_v6.stopEvent(h);
  kch_stop(kch_start(ctx, h, 0, 1000), 2000);
  dccl_event_record_t out[16];
  TEST_ASSERT(ring_take(out, 16) == 1 + DCCL_NET_PEERS, "the record and 8 PEER records");
  dccl_peer_record_t p;
  memcpy(&p, &out[1], sizeof p);
  TEST_ASSERT(p.kind == DCCL_KIND_PEER && p.peer == 0 && p.is_send == 1 && p.seq_number == 5, "peer 0 first");
  TEST_ASSERT(p.proxy_ops == 2 && p.steps == 1 && p.bytes == 4096 && p.reserved[0] == 1,
              "ops %u steps %u bytes %llu dropped %llu", p.proxy_ops, p.steps, (unsigned long long)p.bytes,
              (unsigned long long)p.reserved[0]);
  uint64_t stale0 = atomic_load(&dccl_g.chain_stale);
  ncclProfiler_v6.recordEventState(step, ncclProfilerProxyStepSendWait, &a); /* after completion */
  TEST_ASSERT(atomic_load(&dccl_g.chain_stale) == stale0 + 1, "a late step state is counted");
  ncclProfiler_v6.finalize(ctx);
  clear_env();
  unsetenv("DYNAMICCL_EVENT_MASK");
  return 0;
}
