#!/usr/bin/env bash
# The GPU checks of docs/benchmarks.md (issues 5 and 39), in parts that fit 10-minute device calls.
#
#   here, once:    bash scripts/gpu_session.sh fetch     # wheels the device image lacks -> .whl/
#                                                        # and the TRL anchor script -> shared/bench/
#   on the GPU:    bash scripts/gpu_session.sh PART [PART ...]   (carry .whl), parts:
#     gputests   the GPU-marked tests alone (CUDA-only paths: graphs, offload, packing's kernels)
#     tests      GPU-marked tests, then the decode/generation/trainer/learner/precision tests on a CUDA host
#     standard   0.5b, standard shape, beside TRL
#     long       0.5b, long shape, beside TRL
#     engines    0.5b standard: the dynamic KV cache, the static cache without CUDA graphs, the hf engine
#     roles      0.5b standard: --algos grpo,ppo (memory by role); --precision bf16_mixed (TRL's numerics)
#     fit16      1.5b shapes under a 16 GiB cap (torch.cuda.set_per_process_memory_fraction)
#     fit16-full the two full fine-tunes of fit16 alone
#     fit16-offload  issue 40: the full bf16_kahan 1.5B fine-tune in 16 GiB with AdamW's states offloaded to
#                the CPU and packed micro-batches (beta 0), then with the reference too (beta 0.04, offloaded)
#     extras     0.5b standard without gradient checkpointing; with the dynamic KV cache
#     fusedtests the fused decode layers' tests (rollout.compile), their CUDA-graph test included
#     tune       issue 49: the standard shape by default and under each candidate setting of scripts/pick_settings.py,
#                which keeps what beat the defaults -> $OUT/chosen.txt
#     standard-chosen, long-chosen   0.5b standard / long beside TRL under the settings `tune` chose
#     long-chosen-ours   the long shape, grpokit alone, under them
#     profile-update  scripts/profile_step.py over the reference pass and the update (generation not recorded)
#     profile-decode  the same over a decode of 24 tokens a completion (the other phases not recorded)
#     no-ckpt    0.5b standard, grpokit alone, without gradient checkpointing (what the update gains where it fits)
#     xlong      0.5b, completion 4096, beside TRL (the memory shape)
#     bounds     issue 49: 0.5b standard and long, grpokit alone: each phase's time against its bound on this card
#                (the bench's "bounds": decode bytes / bandwidth, reference and update FLOP / peak, datasheet rates)
#     profile    0.5b standard: torch.profiler over one step (scripts/profile_step.py): per phase its top kernels
#                and the gaps between them -> $OUT/profile.txt, profile.json
#     profile-long   the same on the long shape -> $OUT/profile-long.txt, profile-long.json
#     less-work  0.5b standard, grpokit alone, with optim.shared_prefix and optim.skip_flat_rows off, then on (the
#                defaults): what the shared prompt saves in the update under gradient checkpointing on a card
#
# Issue 49, the next device session (one call; 2026-11-29 spent 15 minutes in two): measure the candidates against
# the defaults, run the faster settings beside TRL on both shapes, and profile the decode:
#   GRPOKIT_CACHE=/tmp/gk DEADLINE=$(( $(date +%s) + 480 )) \
#     bash scripts/gpu_session.sh fusedtests tune standard-chosen long-chosen profile-decode
# (the first bench builds the random 0.5b model, kept in $GRPOKIT_CACHE for the others; the whole-step `profile` does
# not finish on a GPU: use profile-update and profile-decode).
#
# Each part has its own time limit, cut to what is left before $DEADLINE (epoch seconds) where that is set (a hang costs that part, not the call); each bench appends its JSON
# result, labelled, to $OUT/results.jsonl and its table to $OUT/log.txt (the device tool brings back at
# most 8 files). $OUT is the device tool's output folder; runs/gpu when unset.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: gpu_session.sh fetch | PART [PART ...]" >&2; exit 2; }
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"

if [ "$1" = fetch ]; then
  set -e
  exclude="$(git rev-parse --git-dir)/info/exclude"   # keep the wheels and the anchor copy untracked
  mkdir -p "$(dirname "$exclude")"
  for pattern in /.whl/ /shared/; do grep -qx "$pattern" "$exclude" 2>/dev/null || echo "$pattern" >> "$exclude"; done
  mkdir -p shared/bench && cp ../shared/bench/*.py shared/bench/
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0 \
    latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 torch-optimi==0.3.3
  ls -la .whl
  exit 0
fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
} 2>&1 | tee -a "$LOG"

# within_deadline LABEL LIMIT_S: the limit cut to the seconds left before $DEADLINE (epoch seconds, when set: a device
# session's budget), or a note and status 1 when fewer than 30 are left (the part is skipped)
within_deadline() {
  local limit=$2 left
  [ -n "${DEADLINE:-}" ] || { echo "$limit"; return 0; }
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 30 ]; then echo "=== $1: skipped, ${left}s left before the deadline" | tee -a "$LOG" >&2; return 1; fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "$limit"
}

# bench LABEL LIMIT_S ARGS...: one grpokit bench in its own process, limited, result appended to results.jsonl
bench() {
  local label=$1 limit=$2; shift 2
  limit=$(within_deadline "$label" "$limit") || return 0
  echo "=== $label: grpokit bench $* (limit ${limit}s, $(date -u +%T))" | tee -a "$LOG"
  rm -f /tmp/bench.json
  timeout -k 10 "$limit" python3 -m grpokit bench "$@" --json /tmp/bench.json 2>&1 | grep -v '^RESULT' | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== $label: exit $rc ($(date -u +%T))" | tee -a "$LOG"
  if [ -f /tmp/bench.json ]; then
    python3 -c "import json,sys; r=json.load(open('/tmp/bench.json')); print(json.dumps({'label': sys.argv[1], 'result': r}))" "$label" >> "$OUT/results.jsonl"
  else
    echo "{\"label\": \"$label\", \"exit\": $rc}" >> "$OUT/results.jsonl"
  fi
}

for part in "$@"; do
  case $part in
    tests)
      echo "=== tests ($(date -u +%T))" | tee -a "$LOG"
      timeout -k 10 120 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -30 | tee -a "$LOG"
      timeout -k 10 200 python3 -m pytest -q -p no:cacheprovider tests/integration/test_grpo_trainer.py tests/unit/rollout/test_generation.py \
        tests/integration/test_multiturn_training.py tests/unit/model/test_precision.py tests/unit/train/test_critic.py 2>&1 | tail -40 | tee -a "$LOG"
      ;;
    fusedtests)
      limit=$(within_deadline fusedtests 75) || continue
      echo "=== fusedtests ($(date -u +%T))" | tee -a "$LOG"
      timeout -k 10 "$limit" python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/rollout/test_fused_decode.py \
        tests/unit/model/test_fused_modules.py tests/unit/model/test_fused_logprobs.py 2>&1 | tail -15 | tee -a "$LOG"
      ;;
    gputests)
      echo "=== gputests ($(date -u +%T))" | tee -a "$LOG"
      timeout -k 10 150 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -30 | tee -a "$LOG"
      ;;
    standard) bench standard 330 --shape standard --model-size 0.5b --steps 4 --compare trl ;;
    long) bench long 420 --shape long --model-size 0.5b --steps 3 --compare trl ;;
    long-ours) bench long-ours 150 --shape long --model-size 0.5b --steps 3 ;;
    engines)
      bench standard-dynamic 120 --shape standard --model-size 0.5b --steps 3 --kv-cache dynamic
      bench standard-no-graphs 120 --shape standard --model-size 0.5b --steps 3 --no-cuda-graphs
      bench standard-hf 180 --shape standard --model-size 0.5b --steps 3 --engine hf
      ;;
    roles)
      bench roles-grpo-ppo 240 --shape standard --model-size 0.5b --steps 3 --algos grpo,ppo
      bench standard-bf16-mixed 150 --shape standard --model-size 0.5b --steps 3 --precision bf16_mixed
      ;;
    fit16)
      all='lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]'
      bench 1.5b-lora-cap16 200 --shape standard --model-size 1.5b --steps 3 --memory-cap-gib 16 \
        --set lora.enabled=true --set "$all"
      bench 1.5b-full-kahan-beta0-cap16 200 --shape standard --model-size 1.5b --steps 3 --memory-cap-gib 16 \
        --beta 0 --set optim.micro_batch_size=auto
      bench 1.5b-full-pure-beta0-cap16 150 --shape standard --model-size 1.5b --steps 3 --memory-cap-gib 16 \
        --beta 0 --precision bf16_pure --set optim.micro_batch_size=auto
      ;;
    fit16-offload)
      # GPU holds bf16 weights + gradients (4 B/param, 5.7 GiB) and packed activations; AdamW + Kahan in CPU memory
      bench 1.5b-full-kahan-offload-packed-beta0-cap16 300 --shape standard --model-size 1.5b --steps 3 \
        --memory-cap-gib 16 --beta 0 --precision bf16_kahan --set optim.offload_optimizer=true \
        --set optim.packing=true --set optim.micro_batch_tokens=16384
      bench 1.5b-full-kahan-offload-ref-packed-cap16 220 --shape standard --model-size 1.5b --steps 2 \
        --memory-cap-gib 16 --beta 0.04 --precision bf16_kahan --set optim.offload_optimizer=true \
        --set optim.offload_reference=true --set optim.packing=true --set optim.micro_batch_tokens=16384
      ;;
    fit16-full)
      bench 1.5b-full-kahan-beta0-cap16 130 --shape standard --model-size 1.5b --steps 3 --memory-cap-gib 16 \
        --beta 0 --set optim.micro_batch_size=auto
      bench 1.5b-full-pure-beta0-cap16 130 --shape standard --model-size 1.5b --steps 3 --memory-cap-gib 16 \
        --beta 0 --precision bf16_pure --set optim.micro_batch_size=auto
      ;;
    no-ckpt) bench standard-no-checkpointing 100 --shape standard --model-size 0.5b --steps 3 --no-gradient-checkpointing ;;
    extras)
      bench standard-no-checkpointing 100 --shape standard --model-size 0.5b --steps 3 --no-gradient-checkpointing
      bench standard-dynamic 100 --shape standard --model-size 0.5b --steps 3 --kv-cache dynamic
      ;;
    bounds)
      bench bounds-standard 200 --shape standard --model-size 0.5b --steps 3
      bench bounds-long 200 --shape long --model-size 0.5b --steps 2
      ;;
    profile | profile-long)
      shape=standard limit=150
      [ "$part" = profile-long ] && shape=long limit=240
      echo "=== $part ($(date -u +%T))" | tee -a "$LOG"
      timeout -k 10 $limit python3 scripts/profile_step.py --model-size 0.5b --shape $shape --warmup 2 \
        --out "$OUT/$part.txt" --json "$OUT/$part.json" > /dev/null 2>> "$LOG"
      echo "=== $part: exit $? ($(date -u +%T))" | tee -a "$LOG"
      ;;
    less-work)
      bench standard-padded-prompts 150 --shape standard --model-size 0.5b --steps 3 \
        --set optim.shared_prefix=false --set optim.skip_flat_rows=false
      bench standard-shared-prompts 150 --shape standard --model-size 0.5b --steps 3
      ;;
    tune)
      # issue 49: the standard shape, grpokit alone: the defaults, then each candidate of scripts/pick_settings.py
      # (optim.fused_logprobs, optim.shared_prefix back on, LM-head chunks of 2048 rows), which keeps what beat the
      # defaults -> $OUT/chosen.txt. (On 2026-11-29 the candidates were the padded forward and rollout.compile.)
      bench tune-default 110 --shape standard --model-size 0.5b --steps 3
      bench tune-fused-logprobs 100 --shape standard --model-size 0.5b --steps 3 --set optim.fused_logprobs=true
      bench tune-shared-prefix 70 --shape standard --model-size 0.5b --steps 3 --set optim.shared_prefix=true
      bench tune-chunk-2048 70 --shape standard --model-size 0.5b --steps 3 --set optim.logprob_chunk_size=2048
      python3 scripts/pick_settings.py "$OUT/results.jsonl" > "$OUT/chosen.txt" 2>> "$LOG"
      echo "chosen: $(tr '\n' ' ' < "$OUT/chosen.txt")" | tee -a "$LOG"
      ;;
    standard-chosen | long-chosen | long-chosen-ours | profile-update | profile-decode)
      # under the settings `tune` chose (bench arguments, one a line: --set KEY=VALUE pairs)
      mapfile -t chosen < <([ -f "$OUT/chosen.txt" ] && grep -v '^$' "$OUT/chosen.txt")
      case $part in
        standard-chosen) bench standard-chosen 170 --shape standard --model-size 0.5b --steps 4 --compare trl "${chosen[@]}" ;;
        long-chosen) bench long-chosen 230 --shape long --model-size 0.5b --steps 2 --compare trl "${chosen[@]}" ;;
        long-chosen-ours) bench long-chosen-ours 90 --shape long --model-size 0.5b --steps 2 "${chosen[@]}" ;;
        *)
          # the update and the reference pass of the standard shape (generation runs, not recorded); the decode of
          # 24 tokens a completion (the update's and reference's passes run, not recorded)
          limit=$(within_deadline "$part" 120) || continue
          echo "=== $part ($(date -u +%T))" | tee -a "$LOG"
          skip=(--skip generation) extra=()
          [ "$part" = profile-decode ] && skip=(--skip reference --skip update) extra=(--set rollout.max_new_tokens=24)
          timeout -k 10 "$limit" python3 scripts/profile_step.py --model-size 0.5b --shape standard --warmup 1 \
            "${skip[@]}" "${chosen[@]}" "${extra[@]}" --out "$OUT/$part.txt" --json "$OUT/$part.json" > /dev/null 2>> "$LOG"
          echo "=== $part: exit $? ($(date -u +%T))" | tee -a "$LOG"
          ;;
      esac
      ;;
    xlong) bench xlong 500 --shape xlong --model-size 0.5b --steps 2 --compare trl ;;
    *) echo "unknown part $part" | tee -a "$LOG" ;;
  esac
done
echo "=== done ($(date -u +%T))" | tee -a "$LOG"
