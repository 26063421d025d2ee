# The peer pipeline's recipe for the bench scripts (source this file): the peer's default mix
# (fineweb-edu 0.40, c4 0.15, zyda-2 0.30, the-stack-v2 0.10, finemath 0.05), first_exhausted,
# seed 0, over $CORPUS (../shared/bench/peer/make_corpus.py output), tokenized with $TOK (EOS
# token $EOS, default <|endoftext|>).
#
#   peer_recipe SEQ_LEN BUFFER [LANES]    # LANES > 0 adds [lanes] count = LANES, block_windows = 4
#   MIX_UNIT=tokens peer_recipe …         # weights as shares of tokens ([mix] unit)
#   SPLIT_BYTES=16384 peer_recipe …       # oversize = "split" at that max_document_bytes for the
#                                         # sources in SPLIT_SOURCES (default: the-stack-v2)
#   PEER_WEIGHTS="w1 w2 w3 w4 w5" peer_recipe …   # other weights, in the sources' order
#   POOL_DOCUMENTS=10000 peer_recipe …    # [packing] strategy = "best_fit" with that pool
# bench_tokenizer NAME: sets TOK (the tokenizer.json's path) and EOS for gpt2, qwen3, llama3,
# llama2, gemma, gemma3, yi, deepseek_v3, cl100k, o200k, command_r, claude or tekken (all but the first two fetched by
# config/tokenizers/fetch.sh).
# Needs ROOT (the repository).
bench_tokenizer() {
  case "$1" in
    gpt2) TOK="$ROOT/config/tokenizers/gpt2/tokenizer.json"; EOS="<|endoftext|>" ;;
    qwen3) TOK="$ROOT/config/tokenizers/qwen3/tokenizer.json"; EOS="<|endoftext|>" ;;
    llama3) TOK="$("$ROOT/config/tokenizers/fetch.sh" llama3)"; EOS="<|end_of_text|>" ;;
    llama2) TOK="$("$ROOT/config/tokenizers/fetch.sh" llama2)"; EOS="</s>" ;;
    gemma|gemma3) TOK="$("$ROOT/config/tokenizers/fetch.sh" "$1")"; EOS="<eos>" ;;
    yi) TOK="$("$ROOT/config/tokenizers/fetch.sh" yi)"; EOS="<|endoftext|>" ;;
    deepseek_v3) TOK="$("$ROOT/config/tokenizers/fetch.sh" deepseek_v3)"; EOS="<｜end▁of▁sentence｜>" ;;
    cl100k|o200k) TOK="$("$ROOT/config/tokenizers/fetch.sh" "$1")"; EOS="<|endoftext|>" ;;
    command_r) TOK="$("$ROOT/config/tokenizers/fetch.sh" command_r)"; EOS="<EOS_TOKEN>" ;;
    claude) TOK="$("$ROOT/config/tokenizers/fetch.sh" claude)"; EOS="<EOT>" ;;
    tekken) TOK="$("$ROOT/config/tokenizers/fetch.sh" tekken)"; EOS="</s>" ;;
    *) echo "unknown tokenizer $1" >&2; exit 2 ;;
  esac
}

# dsprep_bin: sets BIN to DSPREP_BIN, or builds the release dsprep here and uses it.
dsprep_bin() {
  if [ -z "${DSPREP_BIN:-}" ]; then
    (cd "$ROOT" && cargo build --release -p dsprep --quiet)
  fi
  BIN="${DSPREP_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/dsprep}"
}

peer_recipe() {
  printf 'version = 1\n[tokenizer]\npath = "%s"\neos = "%s"\n[packing]\nseq_len = %s\n' "$TOK" "${EOS:-<|endoftext|>}" "$1"
  if [ -n "${POOL_DOCUMENTS:-}" ]; then printf 'strategy = "best_fit"\npool_documents = %s\n' "$POOL_DOCUMENTS"; fi
  printf '[shuffle]\nseed = 0\nbuffer_size = %s\n[mix]\nstopping = "first_exhausted"\nunit = "%s"\n' "$2" "${MIX_UNIT:-documents}"
  if [ "${3:-0}" != 0 ]; then printf '[lanes]\ncount = %s\nblock_windows = 4\n' "$3"; fi
  local s name weight col k=0 weights   # must not clobber the caller's variables
  read -r -a weights <<<"${PEER_WEIGHTS:-}"
  for s in fineweb-edu:0.40:text c4:0.15:text zyda-2:0.30:text the-stack-v2:0.10:content finemath:0.05:text; do
    IFS=: read -r name weight col <<<"$s"
    weight="${weights[$k]:-$weight}"; k=$((k + 1))
    printf '[[source]]\nname = "%s"\nweight = %s\nfiles = ["%s/%s/*.parquet"]\nformat = "parquet"\ntext = "%s"\n' \
      "$name" "$weight" "$CORPUS" "$name" "$col"
    if [ -n "${SPLIT_BYTES:-}" ] && [[ " ${SPLIT_SOURCES:-the-stack-v2} " == *" $name "* ]]; then
      printf 'max_document_bytes = %s\noversize = "split"\n' "$SPLIT_BYTES"
    fi
  done
}
