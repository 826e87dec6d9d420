#!/usr/bin/env python3
"""Records llama.cpp's token ids for kiln's GGUF SentencePiece test (tokenizer.ggml.model = llama).

Takes the SentencePiece BPE model that make_tokenizer_json_fixture.py trained (spm/m.model),
writes its vocabulary as a vocabulary-only GGUF the way llama.cpp's convert_hf_to_gguf.py does for
Llama 2 (tokens, scores, token types; BOS/EOS/UNK ids; add_bos, add_space_prefix), then asks
llama.cpp (llama-cpp-python, vocab_only) to tokenize the shared strings of cases.json with
parse_special and to detokenize the result.

Usage: /tmp/pyref/bin/python python/make_spm_gguf_fixture.py [tests/data/tokenizer_json]
Needs: gguf, sentencepiece, llama-cpp-python (python/requirements-fixtures.txt).
"""
import json
import os
import sys

import gguf
import llama_cpp
import sentencepiece as spm

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def write_vocab_gguf(model_path, out_path):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL)
        elif sp.is_byte(i):
            types.append(BYTE)
        elif sp.is_unused(i):
            types.append(5)
        elif sp.id_to_piece(i) == "<tool_call>":
            types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name("kiln spm fixture")
    # The hyper-parameters llama.cpp reads before it looks at the vocabulary.
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(32)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                              "tokenizer_json")
    vocab_path = os.path.join(data, "spm", "vocab.gguf")
    write_vocab_gguf(os.path.join(data, "spm", "m.model"), vocab_path)
    with open(os.path.join(data, "cases.json"), encoding="utf-8") as fh:
        strings = json.load(fh)["strings"]
    llm = llama_cpp.Llama(model_path=vocab_path, vocab_only=True, verbose=False)
    ids, decoded = [], []
    for s in strings:
        t = llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)
        ids.append(t)
        decoded.append(llm.detokenize(t, special=True).decode("utf-8", errors="replace"))
    with open(os.path.join(data, "spm", "llamacpp_ids.json"), "w", encoding="utf-8") as fh:
        json.dump({"llama_cpp_python": llama_cpp.__version__, "ids": ids, "decoded": decoded}, fh,
                  ensure_ascii=False, separators=(",", ":"))
    print(f"{len(strings)} strings; round trips: {sum(d == s for d, s in zip(decoded, strings))}")


if __name__ == "__main__":
    main()
