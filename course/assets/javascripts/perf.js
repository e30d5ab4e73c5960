/* Step-time calculator and layout planner: minimega.analysis.perf and minimega.analysis.plan in JavaScript.
 *
 * The compute half (mmPerf) mirrors perf.step_time and perf_plan.plan term by term, on top of the memory
 * calculator (calculator.js, mmMemory); the test suite runs both under Node on random configurations and
 * requires the Python numbers to 1e-9 relative. The page half adds a time/MFU panel and a planner to the
 * calculator page; it starts from document$ (theme.js), once the page is parsed.
 */
(function (root) {
  "use strict";

  var mem = typeof module !== "undefined" && module.exports ? require("./calculator.js") : root.mmMemory;
  var GB = 1e9;
  var STACKS = {"megatron": 1.0, "megatron-deepspeed": 0.77};

  function link(name, bandwidth, alpha) { return {name: name, bandwidth: bandwidth, alpha: alpha, efficiency: 0.8}; }
  var NVLINK3 = link("NVLink 3 (A100)", 300 * GB, 5e-6), NVLINK4 = link("NVLink 4 (H100/H200)", 450 * GB, 5e-6);
  var IB_HDR = link("InfiniBand HDR 200 Gb/s", 25 * GB, 10e-6), IB_NDR = link("InfiniBand NDR 400 Gb/s", 50 * GB, 10e-6);
  var PCIE4 = link("PCIe Gen4 x16", 32 * GB, 10e-6), PCIE5 = link("PCIe Gen5 x16", 64 * GB, 10e-6);
  var NVLINK5 = link("NVLink 5 (B200/GB200)", 900 * GB, 5e-6);
  var XGMI_MI300X = link("Infinity Fabric (MI300X, 7 links)", 448 * GB, 5e-6);
  var C2C_GB200 = link("NVLink-C2C (GB200, per GPU)", 225 * GB, 10e-6);
  var PER_DRIVE = [2.5 * GB, 1.25 * GB];            // hardware.PER_DRIVE: one NVMe SSD's achieved read, write
  var DISK_4 = [4 * PER_DRIVE[0] / 8, 4 * PER_DRIVE[1] / 8], DISK_8 = [8 * PER_DRIVE[0] / 8, 8 * PER_DRIVE[1] / 8];
  function hw(name, peak, hbm, memory, intra, inter, host, hostMem, node) {
    node = node || {};
    var disk = node.disk || DISK_4;
    return {name: name, peak_flops: peak, hbm_bandwidth: hbm, memory_bytes: memory,
            gpus_per_node: node.gpus_per_node || 8, nvlink_domain: node.nvlink_domain || null, intra: intra,
            mesh: !!node.mesh, inter: inter, nics_per_node: node.nics_per_node || 8, matmul_efficiency: 0.75,
            memory_efficiency: 0.8, host: host, host_memory_bandwidth: hostMem, fp8_flops: node.fp8 || null,
            disk_read_bandwidth: disk[0], disk_write_bandwidth: disk[1]};
  }
  var HARDWARE = {                                   // perf_hardware.HARDWARE
    "a100-40gb": hw("A100 SXM4 40GB", 312e12, 1555 * GB, 40 * GB, NVLINK3, IB_HDR, PCIE4, 51.2 * GB),
    "a100-80gb": hw("A100 SXM4 80GB", 312e12, 2039 * GB, 80 * GB, NVLINK3, IB_HDR, PCIE4, 51.2 * GB),
    "h100": hw("H100 SXM5 80GB", 989e12, 3350 * GB, 80 * GB, NVLINK4, IB_NDR, PCIE5, 76.8 * GB, {fp8: 1979e12, disk: DISK_8}),
    "h200": hw("H200 SXM 141GB", 989e12, 4800 * GB, 141 * GB, NVLINK4, IB_NDR, PCIE5, 76.8 * GB, {fp8: 1979e12, disk: DISK_8}),
    "b200": hw("B200 SXM 180GB", 2250e12, 7700 * GB, 180 * GB, NVLINK5, IB_NDR, PCIE5, 76.8 * GB, {fp8: 4500e12, disk: DISK_8}),
    "gb200-nvl72": hw("GB200 NVL72 (B200 186GB)", 2500e12, 8000 * GB, 186 * GB, NVLINK5, IB_NDR, C2C_GB200, 250 * GB,
                      {gpus_per_node: 4, nics_per_node: 4, nvlink_domain: 72, fp8: 5000e12, disk: DISK_8}),
    "mi300x": hw("MI300X OAM 192GB", 1307.4e12, 5300 * GB, 192 * GB, XGMI_MI300X, IB_NDR, PCIE5, 76.8 * GB,
                 {mesh: true, fp8: 2614.9e12, disk: DISK_8})
  };

  function hardware(h) {
    if (typeof h !== "string") return h;
    if (!HARDWARE[h]) throw new Error("hardware " + h + ": expected one of " + Object.keys(HARDWARE).join(", "));
    return HARDWARE[h];
  }
  function beta(l) { return l.bandwidth * l.efficiency; }
  function world(c) { return c.dp * c.cp * c.tp * c.pp; }            // PerfConfig.n_gpus
  function domain(h) { return h.nvlink_domain || h.gpus_per_node; }   // Hardware.domain
  function linkFor(h, span, world) {                 // Hardware.link
    var d = domain(h);
    if (span <= d && (d % span === 0 || (world !== undefined && world <= d))) {
      if (!h.mesh || span >= d) return h.intra;
      return {name: h.intra.name, bandwidth: h.intra.bandwidth * (Math.max(span, 2) - 1) / (d - 1),
              alpha: h.intra.alpha, efficiency: h.intra.efficiency};
    }
    return {name: h.inter.name, bandwidth: h.inter.bandwidth * (h.nics_per_node / h.gpus_per_node),
            alpha: h.inter.alpha, efficiency: h.inter.efficiency};
  }
  function ridge(h) { return h.peak_flops * h.matmul_efficiency / (h.hbm_bandwidth * h.memory_efficiency); }

  function ringTime(op, size, n, alpha, bw) {        // estimate.ring_time
    if (n <= 1) return 0;
    var f = {all_reduce: 2, reduce_scatter: 1, all_gather: 1}[op];
    return f * (n - 1) * alpha + f * (n - 1) / n * size / bw;
  }

  function collectiveTime(op, size, n, l, algorithm) {   // perf.collective_time
    algorithm = algorithm || "ring";
    if (["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"].indexOf(op) < 0)
      throw new Error("collective " + op);
    if (algorithm !== "ring" && algorithm !== "tree") throw new Error("algorithm " + algorithm);
    if (op === "send_recv") return l.alpha + size / beta(l);
    if (n <= 1) return 0;
    if (algorithm === "tree") {
      if (op !== "all_reduce") throw new Error("algorithm 'tree' is implemented for all_reduce only");
      return 2 * Math.log2(n) * l.alpha + 2 * size / beta(l);
    }
    if (op === "all_to_all") return (n - 1) * l.alpha + (n - 1) / n * size / beta(l);
    return ringTime(op, size, n, l.alpha, beta(l));
  }

  var DEFAULTS = {micro_batch: 1, precision: "mixed", zero_stage: 0, tp: 1, dp: 1, pp: 1, cp: 1, sp: false,
                  recompute: "none", schedule: "1f1b", virtual_stages: 1, offload: "none", offload_device: "cpu", attention: "unfused",
                  position_embedding: true, fp32_grads: false, pp_partition: "blocks", global_batch: 1,
                  dropout: true, bucket_bytes: 25e6, stack: "megatron", overlap_comm: true,
                  experts: 0, top_k: 2, capacity_factor: 1.25, ep: 1, expert_ffn: 0, shared_experts: 0, moe_dispatch: "capacity",
                  cp_attention: "ring", kv_heads: 0, ffn: 0, mlp: "gelu", tied: true, bias: true};

  function perfConfig(input) {                       // perf.PerfConfig (+ check)
    var c = {}, k;
    for (k in DEFAULTS) c[k] = DEFAULTS[k];
    for (k in input) if (k !== "micro_batches") c[k] = input[k];
    if (!(Number.isInteger(c.global_batch) && c.global_batch >= 1)) throw new Error("global_batch = " + c.global_batch);
    var per = c.dp * c.micro_batch;
    if (c.global_batch % per !== 0) throw new Error("global_batch is not a multiple of dp*micro_batch");
    c.micro_batches = c.global_batch / per;
    mem.memoryPerGpu(memCfg(c));                     // MemoryConfig.check
    if (c.zero_stage >= 2 && c.pp > 1) throw new Error("ZeRO-2/3 do not compose with pipeline parallelism");
    if (c.precision === "fp8" && c.experts)
      throw new Error("precision fp8 with experts: minimega's fp8 linears are the dense blocks' (the experts are not converted); use bf16");
    if (c.schedule === "interleaved") {
      if (c.pp === 1 || c.virtual_stages < 2) throw new Error("schedule='interleaved' needs pp > 1 and virtual_stages >= 2");
      if (c.layers % (c.pp * c.virtual_stages) !== 0) throw new Error("interleaved: layers not a multiple of pp*v");
      if (c.micro_batches % c.pp !== 0) throw new Error("interleaved: micro-batches must be a multiple of pp");
    } else if (c.virtual_stages !== 1) throw new Error("virtual_stages needs schedule='interleaved'");
    if (!(c.stack in STACKS)) throw new Error("stack " + c.stack);
    return c;
  }

  function memCfg(c) {
    var out = {}, k;
    ["layers", "hidden", "heads", "vocab", "seq_len", "micro_batch", "precision", "zero_stage", "tp", "dp", "pp", "cp", "sp",
     "recompute", "schedule", "micro_batches", "virtual_stages", "offload", "offload_device", "attention", "position_embedding",
     "fp32_grads", "pp_partition", "experts", "top_k", "capacity_factor", "ep", "expert_ffn", "shared_experts", "moe_dispatch", "cp_attention", "kv_heads", "ffn", "mlp",
     "tied", "bias"].forEach(function (k2) { out[k2] = c[k2]; });
    return out;
  }

  function layerOps(c) {                             // perf.layer_ops
    var s = c.seq_len, b = c.micro_batch, h = c.hidden, a = c.heads, t = c.tp;
    var e = c.precision === "fp32" ? 4 : 2;
    var N = Math.floor(s / c.cp) * b, ht = h / t, at = a / t;   // the rank's tokens; its queries see all s keys
    var qkv = (h + 2 * mem.kvWidth(c)) / t, kt = mem.kvWidth(c) / t, ft = mem.ffnWidth(c) / t;   // GPT: 3h, h, 4h /t
    var rep = (c.sp && t > 1) ? t : 1;
    var drop = c.dropout ? 1 : 0;
    var ops = [["layernorm", 8 * N * h / rep, 2 * N * h * e / rep],
               ["qkv", 2 * N * h * qkv, e * (N * h + h * qkv + N * qkv)]];
    if (c.attention === "fused") ops.push(["attention (fused)", 4 * N * s * ht, e * (2 * N * ht + 2 * N * kt)]);
    else {
      var scores = at * s * N;
      ops.push(["scores q·kᵀ", 2 * N * s * ht, e * (N * ht + N * kt + scores)], ["softmax", 5 * scores, 2 * e * scores]);
      if (drop) ops.push(["attention dropout", scores, 2 * e * scores + scores]);
      ops.push(["scores·v", 2 * N * s * ht, e * (scores + N * kt + N * ht)]);
    }
    ops.push(["proj", 2 * N * ht * h, e * (N * ht + ht * h + N * h)],
             ["dropout+residual", 3 * N * h / rep, (3 * e + drop) * N * h / rep],
             ["layernorm", 8 * N * h / rep, 2 * N * h * e / rep]);
    var up = [2 * N * h * ft, e * (N * h + h * ft + N * ft)], down = ["fc2", 2 * N * ft * h, e * (N * ft + ft * h + N * h)];
    if (c.experts) ops = ops.concat(moeOps(c));
    else if (c.mlp === "swiglu") ops.push(["gate", up[0], up[1]], ["up", up[0], up[1]], ["silu·mul", 6 * N * ft, 3 * e * N * ft], down);
    else ops.push(["fc1", up[0], up[1]], ["gelu", 8 * N * ft, 2 * e * N * ft], down);
    ops.push(["dropout+residual", 3 * N * h / rep, (3 * e + drop) * N * h / rep]);
    return ops;
  }

  function moeOps(c) {                               // perf.moe_ops
    var s = Math.floor(c.seq_len / c.cp), b = c.micro_batch, h = c.hidden, E = c.experts, k = c.top_k;
    var e = c.precision === "fp32" ? 4 : 2, f = c.expert_ffn || 4 * h, N = s * b, local = E / c.ep, R, dispatch, combine;
    if (c.moe_dispatch === "dropless") {             // R = N·k routed rows: gathered, run, scattered back with the gates
      R = N * k;
      dispatch = ["gather", 0, 2 * e * R * h + 8 * R];
      combine = ["scatter + combine", 2 * R * h, e * (R * h + R + N * h) + 8 * R];
    } else {                                         // R = b·E·C capacity slots; the one-hot contractions
      var EC = E * mem.moeCapacity(s, E, k, c.capacity_factor), mixF = 2 * N * EC * h, mixB = e * (N * EC + N * h + b * EC * h);
      R = b * EC;
      dispatch = ["dispatch", mixF, mixB];
      combine = ["combine", mixF, mixB];
    }
    var ops = [["router", 2 * N * h * E, e * (N * h + h * E + N * E)],
               ["router softmax", 5 * N * E, 2 * e * N * E],
               dispatch,
               ["expert fc1", 2 * R * h * f, e * (R * h + local * f * h + R * f)],
               ["expert gelu", 8 * R * f, 2 * e * R * f],
               ["expert fc2", 2 * R * f * h, e * (R * f + local * f * h + R * h)],
               combine];
    if (c.shared_experts) {
      var g = c.shared_experts * f;
      ops.push(["shared fc1", 2 * N * h * g, e * (N * h + g * h + N * g)], ["shared gelu", 8 * N * g, 2 * e * N * g],
               ["shared fc2", 2 * N * g * h, e * (N * g + g * h + N * h)], ["shared add", N * h, 3 * e * N * h]);
    }
    return ops;
  }
  var CORE = ["scores q·kᵀ", "softmax", "attention dropout", "scores·v", "attention (fused)"];
  var FP8_GEMMS = ["qkv", "proj", "fc1", "fc2", "gate", "up"];   // perf.FP8_GEMMS: the blocks' Linear layers

  function headOps(c) {
    var N = Math.floor(c.seq_len / c.cp) * c.micro_batch, h = c.hidden, Vt = c.vocab / c.tp, e = c.precision === "fp32" ? 4 : 2;
    return [["logits", 2 * N * h * Vt, e * (N * h + h * Vt + N * Vt)], ["cross-entropy", 5 * N * Vt, (e + 4 + 4) * N * Vt]];
  }

  function opTime(f, by, h, peak) {                  // perf.op_time
    return Math.max(f / ((peak || h.peak_flops) * h.matmul_efficiency), by / (h.hbm_bandwidth * h.memory_efficiency));
  }
  function opPeak(c, h, name) {                      // perf.op_peak
    return c && c.precision === "fp8" && FP8_GEMMS.indexOf(name) >= 0 ? h.fp8_flops : h.peak_flops;
  }
  function sumTimes(ops, h, only, c) {               // c: the config, for fp8 GEMM rates (the attention core is bf16)
    var s = 0;
    ops.forEach(function (o) { if (!only || CORE.indexOf(o[0]) >= 0) s += opTime(o[1], o[2], h, only ? null : opPeak(c, h, o[0])); });
    return s;
  }

  function layerTimes(c, h) {                        // perf.layer_times
    var ops = layerOps(c);
    var fwd = sumTimes(ops, h, false, c), core = sumTimes(ops, h, true);
    var recompute = {none: 0, selective: core, full: fwd}[c.recompute];
    var e = c.precision === "fp32" ? 4 : 2;
    var ar = collectiveTime("all_reduce", Math.floor(c.seq_len / c.cp) * c.micro_batch * c.hidden * e, c.tp, linkFor(h, c.tp, world(c)));
    var perPass = c.experts ? 1 : 2;
    var nAr = 2 * perPass + (c.recompute === "full" ? perPass : 0);
    var epComm = 0;
    if (c.experts && c.ep > 1) {
      var rows = c.moe_dispatch === "dropless" ? Math.floor(c.seq_len / c.cp) * c.micro_batch * c.top_k
                 : c.micro_batch * c.experts * mem.moeCapacity(c.seq_len, c.experts, c.top_k, c.capacity_factor);
      var size = rows * c.hidden * e;
      epComm = (4 + (c.recompute === "full" ? 2 : 0)) * collectiveTime("all_to_all", size, c.ep, linkFor(h, c.tp * c.ep, world(c)));
    }
    return {forward: fwd, backward: 2 * fwd, recompute: recompute, tp_comm: nAr * ar, ep_comm: epComm,
            cp_comm: c.cp_attention === "ulysses" ? ulyssesAttentionTime(c, h) : ringAttentionTime(c, h, core)};
  }

  function ringAttentionTime(c, h, core) {           // perf.ring_attention_time
    if (c.cp === 1) return 0;
    var e = c.precision === "fp32" ? 4 : 2;
    var block = 2 * c.micro_batch * Math.floor(c.seq_len / c.cp) * mem.kvWidth(c) / c.tp * e;   // K and V
    var hop = collectiveTime("send_recv", block, 2, linkFor(h, c.cp * c.tp, world(c)));
    var fwd = (c.cp - 1) * hop, bwd = (2 * c.cp - 1) * hop;
    if (c.overlap_comm) { fwd = Math.max(0, fwd - core); bwd = Math.max(0, bwd - 2 * core); }
    return fwd + bwd + (c.recompute !== "none" ? fwd : 0);
  }

  function ulyssesAttentionTime(c, h) {             // perf.ulysses_attention_time
    if (c.cp === 1) return 0;
    var e = c.precision === "fp32" ? 4 : 2;
    var rows = c.micro_batch * Math.floor(c.seq_len / c.cp), l = linkFor(h, c.cp * c.tp, world(c));
    var qOut = collectiveTime("all_to_all", rows * c.hidden / c.tp * e, c.cp, l);
    var kv = collectiveTime("all_to_all", rows * mem.kvWidth(c) / c.tp * e, c.cp, l);
    return (2 + (c.recompute !== "none" ? 1 : 0)) * (2 * qOut + 2 * kv);
  }

  function stageLayers(c) {
    if (c.pp === 1) return [c.layers, c.layers];
    var per;
    if (c.pp_partition === "blocks+embedding") {
      per = Math.ceil((c.layers + 2) / c.pp);
      return [Math.min(c.layers, per - 1), Math.min(c.layers, per - 1)];
    }
    per = Math.ceil(c.layers / c.pp);
    return [per, per];
  }

  function microbatchTime(c, h) {                    // perf.microbatch_time
    var lt = layerTimes(c, h);
    var fl = stageLayers(c), first = fl[0], last = fl[1];
    var head = sumTimes(headOps(c), h) * 3;
    var e = c.precision === "fp32" ? 4 : 2;
    var headTp = collectiveTime("all_reduce", Math.floor(c.seq_len / c.cp) * c.micro_batch * c.hidden * e, c.tp, linkFor(h, c.tp, world(c)));
    var perLayer = lt.forward + lt.backward + lt.recompute;
    var sFirst = first * perLayer + (c.pp > 1 ? 0 : head), sLast = last * perLayer + head;
    var slow = sLast > sFirst ? "last" : "first";     // Python's max() keeps the first on ties
    var blocks = slow === "first" ? first : last;
    var withHead = slow === "last" || c.pp === 1;
    return {forward: blocks * lt.forward + (withHead ? head / 3 : 0),
            backward: blocks * lt.backward + (withHead ? 2 * head / 3 : 0),
            recompute: blocks * lt.recompute, tp_comm: blocks * lt.tp_comm + (withHead ? headTp : 0),
            ep_comm: blocks * lt.ep_comm, cp_comm: blocks * lt.cp_comm, blocks: blocks};
  }

  function bucketed(op, size, n, l, bucket) {
    var k = Math.max(1, Math.ceil(size / bucket));
    var one = collectiveTime(op, size / k, n, l);
    return [k * one, one];
  }

  function modelFlops(B, s, L, h, V) { return 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L)); }
  function hardwareFlops(B, s, l, h, V) { return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)); }

  function stepTime(input, hwIn) {                   // perf.step_time
    var h = hardware(hwIn || "a100-80gb"), c = perfConfig(input);
    if (c.precision === "fp8" && !h.fp8_flops)
      throw new Error("precision fp8 on " + h.name + ": it has no fp8 tensor cores; use bf16 or a GPU with fp8 (H100, H200, B200, GB200, MI300X)");
    var mb = microbatchTime(c, h);
    var m = c.micro_batches, p = c.pp, v = c.virtual_stages, e = c.precision === "fp32" ? 4 : 2;
    var nGpus = c.dp * c.cp * c.tp * c.pp;
    var p2p = 0;
    if (p > 1) p2p = 2 * v * collectiveTime("send_recv", Math.floor(c.seq_len / c.cp) * c.micro_batch * c.hidden * e / c.tp, 2, linkFor(h, nGpus, nGpus));
    var slot = mb.forward + mb.backward + mb.recompute + mb.tp_comm + mb.ep_comm + mb.cp_comm + p2p;
    var bubble = p > 1 ? (p - 1) / v * (slot - (c.schedule === "zb_h1" ? mb.backward : 0)) : 0;   // ZB-H1: (p-1)(tF+tB-tW)
    var stackOverhead = (m + (p - 1) / v) * slot * (1 / STACKS[c.stack] - 1);
    var split = mem.stageParamSplit(memCfg(c)), nStage = split[0], nExpert = split[1];
    var gradB = mem.modelStateBreakdown(1, 1, 0, c.precision, c.fp32_grads ? 4 : null).grads;   // bf16, fp8: fp32 main grads
    var replicas = c.dp * c.cp;                       // ranks holding the same parameters
    var l = linkFor(h, c.tp * c.cp * c.dp, nGpus);
    var lastBwd = mb.backward + mb.recompute;
    var dpComm = 0;
    if (replicas > 1) {
      if (c.zero_stage === 3) {
        var lt = layerTimes(c, h);
        var hh = c.hidden;
        var layerBytes = (c.experts ? (4 * hh * hh + 3 * hh) / c.tp + hh * c.experts + 2 * hh * c.shared_experts * (c.expert_ffn || 4 * hh)
                                    : mem.blockSplitParams(c) / c.tp) * e;
        var fetch = c.offload === "optimizer+params" ? collectiveTime("send_recv", layerBytes / replicas, 2, h.host) : 0;
        var gathered = c.precision === "fp8" ? mem.blockMatmulParams(c) / c.tp : layerBytes;   // E4M3: 1 byte an element
        var ag = fetch + collectiveTime("all_gather", gathered, replicas, l);
        var rs = collectiveTime("reduce_scatter", layerBytes * gradB / e, replicas, l);
        var hideF = c.overlap_comm ? lt.forward : 0, hideB = c.overlap_comm ? lt.backward + lt.recompute : 0;
        var perLayer = Math.max(0, ag - hideF) + Math.max(0, ag + rs - hideB);
        dpComm = m * (mb.blocks * perLayer + 2 * ag + rs);
      } else {
        var tl = bucketed(c.zero_stage === 0 ? "all_reduce" : "reduce_scatter", nStage * gradB, replicas, l, c.bucket_bytes);
        dpComm = p === 1 && c.overlap_comm ? Math.max(tl[1], tl[0] - lastBwd) : tl[0];
        if (c.zero_stage === 1 || c.zero_stage === 2) dpComm += collectiveTime("all_gather", nStage * e, replicas, l);
      }
    }
    var edp = c.dp / c.ep * c.cp;                     // the ranks holding the same experts (edp, times cp)
    if (nExpert && edp > 1) {                         // all-reduce, or ZeRO-1 over edp: reduce-scatter + all-gather
      var xl = bucketed(c.zero_stage === 0 ? "all_reduce" : "reduce_scatter", nExpert * gradB, edp, l, c.bucket_bytes);
      dpComm += p === 1 && c.overlap_comm ? Math.max(xl[1], xl[0] - lastBwd) : xl[0];
      if (c.zero_stage >= 1) dpComm += collectiveTime("all_gather", nExpert * e, edp, l);
    }
    var shard = nStage / (c.zero_stage >= 1 ? replicas : 1) + nExpert / (c.zero_stage >= 1 ? edp : 1);
    var adamBytes = shard * (4 * 6 + gradB + e), optimizer, offload = 0, disk = 0;   // perf_offload.optimizer_time
    if (c.offload === "none") optimizer = adamBytes / (h.hbm_bandwidth * h.memory_efficiency);
    else {                                           // Adam on the CPU; gradients down, 16-bit parameters up
      optimizer = adamBytes / (h.host_memory_bandwidth * h.memory_efficiency);
      var down = collectiveTime("send_recv", shard * gradB, 2, h.host);
      offload = (p === 1 && c.overlap_comm ? Math.max(0, down - lastBwd) : down) + collectiveTime("send_recv", shard * e, 2, h.host);
      if (c.offload_device === "nvme") {             // perf_offload.disk_time: K·Ψ/N_d read and written, K = 12
        var moved = 12 * nStage / replicas;
        var busy = moved / h.disk_read_bandwidth + moved / h.disk_write_bandwidth;
        disk = c.overlap_comm ? Math.max(0, busy - optimizer) : busy;
      }
    }
    var compute = m * (mb.forward + mb.backward + mb.recompute);
    var out = {compute: compute, forward: m * mb.forward, backward: m * mb.backward, recompute: m * mb.recompute,
               tp_comm: m * mb.tp_comm, ep_comm: m * mb.ep_comm, cp_comm: m * mb.cp_comm, p2p: m * p2p, bubble: bubble,
               stack_overhead: stackOverhead, dp_comm: dpComm, offload: offload, optimizer: optimizer, disk: disk};
    out.total = compute + out.tp_comm + out.ep_comm + out.cp_comm + out.p2p + bubble + stackOverhead + dpComm + offload + optimizer + disk;
    var tokens = c.global_batch * c.seq_len;
    var fl = iterationFlops(c), mf = fl[0], logged = fl[1], hf = fl[2];
    var memory = mem.memoryPerGpu(memCfg(c));
    out.tokens_per_s = tokens / out.total;
    out.micro_batches = m;
    out.n_gpus = nGpus;
    out.tflops_per_gpu = logged / out.total / nGpus / 1e12;
    out.model_tflops_per_gpu = mf / out.total / nGpus / 1e12;
    out.mfu = mf / out.total / nGpus / h.peak_flops;
    out.hfu = hf / out.total / nGpus / h.peak_flops;
    out.memory = memory;
    out.fits = memory.total <= h.memory_bytes;
    return out;
  }

  function iterationFlops(c) {                       // shapes.iteration_flops: [model, logged, hardware]
    var B = c.global_batch, s = c.seq_len, L = c.layers, hd = c.hidden, V = c.vocab;
    if (!(mem.kvWidth(c) === hd && mem.ffnWidth(c) === 4 * hd && c.mlp === "gelu")) {   // shapes.shape_flops
      var tokens = B * s, weights = L * mem.blockMatmulParams(c), head = V * hd, attn = tokens * L * s * hd;
      var model = 6 * tokens * (weights + head) + 12 * attn, full = 8 * tokens * weights + 6 * tokens * head + 16 * attn;
      return [model, full, {none: model, full: full, selective: 6 * tokens * (weights + head) + 24 * attn}[c.recompute]];
    }
    var moe = moeExtraFlops(c);
    var mf = modelFlops(B, s, L, hd, V) + moe, logged = hardwareFlops(B, s, L, hd, V) + moe * 4 / 3;
    return [mf, logged, {none: mf, full: logged,
                         selective: 72 * B * L * s * hd * hd * (1 + s / (3 * hd) + V / (12 * hd * L)) + moe}[c.recompute]];
  }

  function moeExtraFlops(c) {                        // perf.moe_extra_flops
    if (!c.experts) return 0;
    var tl = c.global_batch * c.seq_len * c.layers, h = c.hidden, f = c.expert_ffn || 4 * h;
    return tl * (12 * h * f * (c.top_k + (c.shared_experts || 0)) - 48 * h * h + 6 * h * c.experts);
  }

  function divisors(n) { var d = []; for (var i = 1; i <= n; i++) if (n % i === 0) d.push(i); return d; }

  function layoutName(c) {                           // perf_plan.layout_name
    var s = "dp" + c.dp + (c.experts ? "-ep" + c.ep : "") + (c.cp > 1 ? "-cp" + c.cp : "") + "-tp" + c.tp + "-pp" + c.pp +
            " z" + c.zero_stage + " " + c.recompute + " b" + c.micro_batch;
    if (c.cp > 1) s += " " + c.cp_attention;
    if (c.pp > 1) s += " " + c.schedule + (c.schedule === "interleaved" ? " v" + c.virtual_stages : "");
    return s + (c.sp ? " sp" : "");
  }

  function cpVariants(model, n, tp, o) {             // perf_plan._cp_variants
    var out = [];
    o.cps.forEach(function (cp) {
      if (cp === 1) out.push([1, "ring"]);
      else if (n % (tp * cp) === 0 && model.seq_len % (2 * cp) === 0 && model.attention === "fused" &&
               (!model.experts || model.moe_dispatch === "dropless"))
        o.cp_attentions.forEach(function (a) {
          if (a === "ring" || (model.heads % (tp * cp) === 0 && (model.kv_heads || model.heads) % (tp * cp) === 0)) out.push([cp, a]);
        });
    });
    return out;
  }

  function layouts(model, n, B, h, o) {              // perf_plan.layouts
    var out = [];
    if (o.tps) {                                     // perf_plan.check_tps
      var far = o.tps.filter(function (t) { return !(t === Math.floor(t) && t >= 1 && t <= domain(h)); });
      if (far.length) throw new Error("tp " + far.join(", ") + ": tensor parallelism stays inside one NVLink domain, " +
                                      domain(h) + " GPUs on " + h.name + "; ask for tp <= " + domain(h));
    }
    divisors(n).forEach(function (tp) {
      if (tp > domain(h) || model.heads % tp !== 0 || (model.kv_heads || model.heads) % tp !== 0 ||
          (o.tps && o.tps.indexOf(tp) < 0)) return;
      cpVariants(model, n, tp, o).forEach(function (cv) {
        var cp = cv[0];
        divisors(n / (tp * cp)).forEach(function (pp) {
          var dp = n / (tp * cp * pp);
          if (pp > model.layers || B % dp !== 0 || (cp > 1 && pp > 1)) return;
          var experts = model.experts || 0;
          var eps = experts ? divisors(dp).filter(function (e) { return experts % e === 0; }) : [1];
          o.zero_stages.forEach(function (z) { o.recompute.forEach(function (rc) {
            o.micro_batches.forEach(function (b) { o.sp.forEach(function (sp) { eps.forEach(function (ep) {
              if ((z >= 2 && pp > 1) || (z > 0 && dp * cp === 1) || (sp && (tp === 1 || experts || cp > 1)) ||
                  (B / dp) % b !== 0) return;
              var m = B / (dp * b), scheds = [];
              if (pp === 1) scheds = [["1f1b", 1]];
              else o.schedules.forEach(function (sc) {
                (sc === "interleaved" ? [2, 4] : [1]).forEach(function (v) {
                  if (sc !== "interleaved" || (model.layers % (pp * v) === 0 && m % pp === 0)) scheds.push([sc, v]);
                });
              });
              scheds.forEach(function (sv) {
                var c = {}, k;
                for (k in model) c[k] = model[k];
                c.tp = tp; c.pp = pp; c.dp = dp; c.zero_stage = z; c.recompute = rc; c.micro_batch = b; c.sp = sp;
                c.schedule = sv[0]; c.virtual_stages = sv[1]; c.global_batch = B;
                if (experts) c.ep = ep;
                if (cp > 1) { c.cp = cp; c.cp_attention = cv[1]; }
                out.push(c);
              });
            }); }); });
          }); });
        });
      });
    });
    return out;
  }

  function plan(model, n, B, hwIn, opts) {           // perf_plan.plan
    opts = opts || {};
    var h = hardware(hwIn || "a100-80gb");
    var frac = opts.memory_fraction === undefined ? 0.9 : opts.memory_fraction;
    var top = opts.top === undefined ? 10 : opts.top;
    var o = {zero_stages: opts.zero_stages || [0, 1, 2, 3], recompute: opts.recompute || ["none", "selective", "full"],
             schedules: opts.schedules || ["1f1b", "interleaved"], micro_batches: opts.micro_batches || [1, 2, 4, 8, 16],
             sp: opts.sp || [false, true], cps: opts.cps || [1], cp_attentions: opts.cp_attentions || ["ring", "ulysses"],
             tps: opts.tps || null};
    var all = layouts(model, n, B, h, o), fits = [];
    all.forEach(function (c) {
      var m = mem.memoryPerGpu(memCfg(perfConfig(c))).total;
      if (m > h.memory_bytes * frac) return;
      fits.push([c, stepTime(c, h)]);
    });
    fits.sort(function (x, y) {
      return (y[1].tokens_per_s - x[1].tokens_per_s) || (x[1].memory.total - y[1].memory.total);
    });
    return {searched: all.length, fit: fits.length, n_gpus: n, hardware: h.name,
            top: fits.slice(0, top).map(function (cr) {
              var r = {layout: layoutName(perfConfig(cr[0])), memory_gb: cr[1].memory.total / GB}, k;
              for (k in cr[1]) if (k !== "memory") r[k] = cr[1][k];
              return r;
            }),
            ranked: fits.map(function (cr) { return layoutName(perfConfig(cr[0])); })};
  }

  var api = {HARDWARE: HARDWARE, STACKS: STACKS, collectiveTime: collectiveTime, layerOps: layerOps,
             layerTimes: layerTimes, stepTime: stepTime, plan: plan, layoutName: layoutName, ridge: ridge};
  if (typeof module !== "undefined" && module.exports) { module.exports = api; return; }
  root.mmPerf = api;

  /* ---------------------------------------------------------------- page half */
  var PARTS = [["forward", "forward"], ["backward", "backward"], ["recompute", "recompute"], ["tp_comm", "TP all-reduces"],
               ["cp_comm", "ring attention (exposed)"], ["p2p", "pipeline p2p"], ["bubble", "pipeline bubble"], ["stack_overhead", "stack overhead"],
               ["dp_comm", "data-parallel (exposed)"], ["offload", "offload PCIe (exposed)"],
               ["optimizer", "optimizer step"], ["disk", "NVMe reads and writes (exposed)"]];

  /* Words per page language (<html lang>; the Dutch edition is "nl"). */
  var WORDS = {
    en: {parts: {}, step: "step", cannot: "Cannot compute: ", cannotPlan: "Cannot plan: ",
         status: function (cfg, r) {
           return "Global batch " + cfg.global_batch + " on " + r.n_gpus + " GPUs: " + r.total.toFixed(2) +
             " s per step, " + Math.round(r.tokens_per_s).toLocaleString("en") + " tokens/s, " + r.tflops_per_gpu.toFixed(1) +
             " TFLOP/s per GPU (Eq. 3), MFU " + (100 * r.mfu).toFixed(1) + "%, " + (r.fits ? "fits" : "does not fit") + " in memory.";
         },
         searched: function (res) {
           return res.searched + " layouts searched, " + res.fit + " fit 90% of a GPU; the fastest " + res.top.length + " below.";
         },
         num: function (x, digits) { return x.toFixed(digits); }},
    nl: {parts: {recompute: "herberekening", tp_comm: "TP-all-reduces", p2p: "pipeline-p2p",
                 stack_overhead: "overhead van de stack", dp_comm: "data parallel (niet verborgen)",
                 offload: "offload over PCIe (niet verborgen)", optimizer: "optimizer-stap",
                 disk: "NVMe lezen en schrijven (niet verborgen)"},
         step: "stap", cannot: "Kan niet rekenen: ", cannotPlan: "Kan niet plannen: ",
         status: function (cfg, r) {
           return "Globale batch " + cfg.global_batch + " op " + r.n_gpus + " GPU's: " + r.total.toFixed(2).replace(".", ",") +
             " s per stap, " + Math.round(r.tokens_per_s).toLocaleString("nl") + " tokens/s, " +
             r.tflops_per_gpu.toFixed(1).replace(".", ",") + " TFLOP/s per GPU (vgl. 3), MFU " +
             (100 * r.mfu).toFixed(1).replace(".", ",") + "%, " + (r.fits ? "past" : "past niet") + " in het geheugen.";
         },
         searched: function (res) {
           return res.searched + " layouts doorzocht, " + res.fit + " passen in 90% van een GPU; de snelste " +
             res.top.length + " staan hieronder.";
         },
         num: function (x, digits) { return x.toFixed(digits).replace(".", ","); }}
  };
  function words() {
    var lang = (document.documentElement.lang || "en").toLowerCase().slice(0, 2);
    return WORDS[lang] || WORDS.en;
  }

  function readCalc(calc) {
    var f = calc.querySelector("form"), cfg = {};
    ["layers", "hidden", "heads", "vocab", "seq_len", "micro_batch", "tp", "dp", "pp", "cp", "virtual_stages"]
      .forEach(function (k) { cfg[k] = Number(f.elements[k].value); });
    cfg.zero_stage = Number(f.elements.zero_stage.value);
    ["precision", "recompute", "schedule", "offload", "offload_device", "attention", "cp_attention", "pp_partition"].forEach(function (k) { cfg[k] = f.elements[k].value; });
    ["sp", "position_embedding", "fp32_grads", "tied", "bias"].forEach(function (k) { cfg[k] = f.elements[k].checked; });
    ["kv_heads", "ffn"].forEach(function (k) { cfg[k] = Number(f.elements[k].value); });
    cfg.mlp = f.elements.mlp.value;
    cfg.global_batch = cfg.dp * cfg.micro_batch * Number(f.elements.micro_batches.value);
    mem.readExperts(f, cfg);
    return cfg;
  }

  function row(table, label, value) {
    var tr = document.createElement("tr");
    tr.innerHTML = "<th scope=\"row\"></th><td></td>";
    tr.firstChild.textContent = label;
    tr.lastChild.textContent = value;
    table.appendChild(tr);
  }

  function updateTime(el, calc) {
    var f = el.querySelector("form"), status = el.querySelector(".mm-perf-status"), table = el.querySelector("tbody");
    var cfg = readCalc(calc), r;
    cfg.stack = f.elements.stack.value;
    cfg.dropout = f.elements.dropout.checked;
    var w = words();
    table.innerHTML = "";                              // no seconds from an earlier input stay next to an error
    try { r = stepTime(cfg, f.elements.gpu.value); } catch (e) { status.textContent = w.cannot + e.message; return; }
    PARTS.forEach(function (p) { row(table, w.parts[p[0]] || p[1], w.num(r[p[0]], 3)); });
    row(table, w.step, w.num(r.total, 3));
    status.textContent = w.status(cfg, r);
  }

  function runPlan(el, calc) {
    var f = el.querySelector("form"), out = el.querySelector(".mm-plan-status"), table = el.querySelector(".mm-plan-table tbody");
    var c = readCalc(calc);
    var model = {layers: c.layers, hidden: c.hidden, heads: c.heads, vocab: c.vocab, seq_len: c.seq_len,
                 precision: c.precision, attention: c.attention, position_embedding: c.position_embedding,
                 fp32_grads: c.fp32_grads, pp_partition: c.pp_partition, stack: f.elements.stack.value,
                 kv_heads: c.kv_heads, ffn: c.ffn, mlp: c.mlp, tied: c.tied, bias: c.bias,
                 dropout: f.elements.dropout.checked};
    var res;
    try {
      res = plan(model, Number(f.elements.gpus.value), Number(f.elements.global_batch.value), f.elements.gpu.value,
                 {recompute: f.elements.full_only.checked ? ["full"] : undefined});
    } catch (e) { out.textContent = words().cannotPlan + e.message; return; }
    table.innerHTML = "";
    var w = words();
    res.top.forEach(function (r, i) {
      var tr = document.createElement("tr");
      [String(i + 1), r.layout, w.num(r.total, 2), Math.round(r.tokens_per_s).toLocaleString(w === WORDS.nl ? "nl" : "en"),
       w.num(100 * r.mfu, 1), w.num(r.memory_gb, 1)].forEach(function (t) { var td = document.createElement("td"); td.textContent = t; tr.appendChild(td); });
      table.appendChild(tr);
    });
    out.textContent = w.searched(res);
  }

  function init(el) {
    if (el.dataset.ready) return;
    el.dataset.ready = "1";
    var calc = document.getElementById("mm-calculator");
    if (!calc) return;
    var update = function () { updateTime(el, calc); };
    calc.addEventListener("input", update);
    calc.addEventListener("change", update);
    el.querySelector("form").addEventListener("input", update);
    el.querySelector("form").addEventListener("submit", function (ev) { ev.preventDefault(); runPlan(el, calc); });
    update();
  }

  function start() { document.querySelectorAll(".mm-perf").forEach(init); }
  if (root.document$) root.document$.subscribe(function () { setTimeout(start, 0); });
  else document.addEventListener("DOMContentLoaded", start);
})(typeof window !== "undefined" ? window : this);
