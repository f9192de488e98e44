#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/corpus/<target>/.

Each target starts from a handful of small, valid inputs so that a short
CI run already explores past the first parse. Deterministic: re-running it
rewrites the same bytes. Needs Python 3 and, for the tokenizer archive
seed, `tokenizers` (pip install tokenizers==0.22.2, as
tests/fixtures/make_test_model.py pins). Run from anywhere:

    python3 fuzz/make_corpus.py
"""

import io
import json
import shutil
import struct
import zipfile
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
CORPUS = FUZZ / "corpus"


def write(target, name, data):
    path = CORPUS / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def body(value):
    return json.dumps(value, separators=(",", ":")).encode()


# request_json: byte 0 picks the dialect (see fuzz_targets/request_json.rs).
def request_json():
    chat = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ],
        "max_tokens": 16,
        "stop": ["\n\n"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "top_logprobs": 2,
    }
    tools = dict(
        chat,
        tools=[{"type": "function", "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }}],
        tool_choice="auto",
        response_format={"type": "json_schema", "json_schema": {
            "name": "a", "schema": {"type": "object"}}},
    )
    seeds = {
        "chat": (0, chat),
        "chat_tools": (0, tools),
        "completion": (1, {"model": "m", "prompt": ["a", "b"], "n": 2, "echo": True,
                           "logit_bias": {"50256": -100}, "seed": 7}),
        "embeddings": (2, {"model": "m", "input": [[1, 2, 3], "text"],
                           "encoding_format": "base64", "dimensions": 8}),
        "classify": (3, {"model": "m", "input": ["a", "b"]}),
        "responses": (4, {"model": "m", "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Hi"}]},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ], "instructions": "Be brief.", "store": False}),
        "anthropic": (5, {"model": "m", "max_tokens": 32, "system": "Be brief.",
                          "messages": [{"role": "user", "content": [
                              {"type": "text", "text": "Hi"}]}],
                          "stop_sequences": ["END"], "stream": True,
                          "tools": [{"name": "t", "input_schema": {"type": "object"}}]}),
        "generate": (6, {"text": "Hello", "sampling_params": {
            "max_new_tokens": 8, "temperature": 0.5, "stop": ["."], "n": 1},
            "stream": True, "return_logprob": True}),
        "worker": (7, {"url": "grpc://127.0.0.1:30000", "role": "prefill",
                       "bootstrap_port": 8998, "runtime": "sglang",
                       "tensor_transport": "shm", "shm_min_bytes": 4096}),
        "tokenize": (8, {"model": "m", "prompt": "Hello"}),
        "detokenize": (9, {"model": "m", "tokens": [1, 2, 3]}),
    }
    for name, (dialect, value) in seeds.items():
        write("request_json", name, bytes([dialect]) + body(value))
    # Shape errors deep inside a body: the path walk's input.
    write("request_json", "deep_unknown",
          bytes([0]) + b'{"messages":[{"role":"user","content":"x","x":' + b"[" * 64
          + b"]" * 64 + b'}],"model":5}')
    write("request_json", "bad_role",
          bytes([5]) + b'{"model":"m","max_tokens":1,\n"messages":[{"role":"x","content":"y"}]}')


# detokenize: flags, u16 stop length, stop, then u16 ids (0xFFFF splits).
def detokenize():
    vocab = json.loads((ROOT / "tests/fixtures/model/tokenizer.json").read_text())["model"]["vocab"]

    def ids_for(pieces):
        return [vocab[p] for p in pieces if p in vocab]

    words = [t for t in ("H", "ello", "Ġworld", "Ġthe", ",", ".", "Ċ", "Ġa") if t in vocab]
    plain = ids_for(words) or [72, 101, 108]
    # Byte symbols of a 3-byte character split over two pushes.
    euro = ids_for(["â", "Ĥ", "¬"])

    def seed(flags, stop, groups):
        ids = []
        for index, group in enumerate(groups):
            if index:
                ids.append(0xFFFF)
            ids.extend(group)
        stop = stop.encode()
        return (bytes([flags]) + struct.pack("<H", len(stop)) + stop
                + b"".join(struct.pack("<H", i) for i in ids))

    write("detokenize", "plain", seed(0, "", [plain]))
    write("detokenize", "stop_split", seed(0, "lo w", [plain[:1], plain[1:2], plain[2:]]))
    write("detokenize", "split_char", seed(2, ".", [euro[:1], euro[1:], plain]))
    write("detokenize", "special", seed(1, "", [[4001] + plain + [4002, 4000, 4050]]))


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, wire, payload):
    key = varint(number << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 5:
        return key + struct.pack("<f", payload)
    return key + varint(len(payload)) + payload


def packed(values):
    return b"".join(varint(v) for v in values)


def floats(values):
    return b"".join(struct.pack("<f", v) for v in values)


# worker_response: flags, n-1, max_new_tokens, top_logprobs, then
# u16-length-prefixed GenerateResponse messages.
def worker_response():
    # Field numbers per proto/: (chunk index, complete matched_token_id,
    # matched_stop_str, complete index).
    layouts = {"tokenspeed": (0, 6, 7, 8, 9), "sglang": (1, 8, 8, 9, 11)}
    for runtime, (flag, chunk_index, matched_id, matched_str, done_index) in layouts.items():
        logprobs = (field(1, 2, floats([-0.1, -0.2])) + field(2, 2, packed([5, 6]))
                    + field(3, 2, field(1, 2, floats([-0.1, -1.0])) + field(2, 2, packed([5, 9])))
                    + field(3, 2, field(1, 2, floats([-0.2])) + field(2, 2, packed([6]))))
        chunk = (field(1, 2, packed([5, 6])) + field(2, 0, 3) + field(3, 0, 2)
                 + field(5, 2, logprobs) + field(chunk_index, 0, 1))
        done = (field(1, 2, packed([5, 6, 7])) + field(2, 2, b"stop") + field(3, 0, 3)
                + field(4, 0, 3) + field(matched_id, 0, 7) + field(done_index, 0, 1))
        done_text = (field(2, 2, b"stop") + field(matched_str, 2, b"END")
                     + field(done_index, 0, 0))
        messages = [
            field(1, 2, b"r1") + field(2, 2, chunk),
            field(1, 2, b"r1") + field(3, 2, done),
            field(1, 2, b"r1") + field(3, 2, done_text),
        ]
        stream = b"".join(struct.pack("<H", len(m)) + m for m in messages)
        write("worker_response", f"{runtime}_stream", bytes([flag | 2, 1, 16, 2]) + stream)
        # A budget of 1 token: the gateway cuts the chunk (of sequence 1,
        # so n = 2: with n = 1 the input stops at the sequence index).
        write("worker_response", f"{runtime}_cut", bytes([flag, 1, 1, 0]) + stream)



# worker_response, the other answers: byte 0 is the runtime bit plus the
# answer kind in bits 2-4 (1 model info, 2 server info, 3 loads, 4 an
# embedding), then one encoded answer. Field numbers per proto/.
def worker_answers():
    def double(number, value):
        return varint(number << 3 | 1) + struct.pack("<d", value)

    def struct_value(kind, payload):
        # google.protobuf.Value: 1 null, 2 number, 3 string, 4 bool, 5 struct.
        if kind == 2:
            return double(2, payload)
        return field(kind, 0 if kind in (1, 4) else 2, payload)

    def struct_of(entries):
        # google.protobuf.Struct: map<string, Value> fields = 1.
        return b"".join(field(1, 2, field(1, 2, key.encode()) + field(2, 2, value))
                        for key, value in entries)

    shm = struct_of([("shm_namespace_id", struct_value(3, b"0123abcd:64768")),
                     ("nested", struct_value(5, struct_of([
                         ("dp", struct_value(2, 2.0)), ("on", struct_value(4, 1))])))])
    args = struct_of([("model_path", struct_value(3, b"/models/m")),
                      ("tp_size", struct_value(2, 1.0)), ("none", struct_value(1, 0))])
    layouts = {
        # runtime bit; model info: served name, eos ids, pad, bos, version;
        # server info: active, max tokens, version; load: used tokens,
        # max tokens, token usage, throughput, cache hit rate.
        "tokenspeed": (0, (3, 9, 10, 11, 12), (3, 6, 7), (5, 6, 8, 9, 10)),
        "sglang": (1, (6, 11, 12, 13, 5), (3, 10, 7), (5, 6, 7, 8, 9)),
    }
    for runtime, (bit, info, server, load) in layouts.items():
        name, eos, pad, bos, version = info
        model = (field(1, 2, b"/models/m") + field(2, 2, b"/models/m") + field(name, 2, b"m")
                 + field(eos, 2, packed([2, 4002])) + field(pad, 0, 0) + field(bos, 0, 1)
                 + field(version, 2, b"default"))
        write("worker_response", f"{runtime}_model_info", bytes([bit | 1 << 2]) + model)
        active, max_tokens, server_version = server
        info_answer = (field(1, 2, args) + field(2, 2, shm) + field(active, 0, 3)
                       + field(max_tokens, 0, 8192) + field(server_version, 2, b"0.1"))
        write("worker_response", f"{runtime}_server_info", bytes([bit | 2 << 2]) + info_answer)
        used, max_total, usage, throughput, hit = load

        def rank(index, running):
            return (field(1, 0, index) + field(2, 0, running) + field(3, 0, 1)
                    + field(used, 0, 100) + field(max_total, 0, 8192) + double(usage, 0.25)
                    + double(throughput, 12.5) + double(hit, 0.5))

        loads = field(3, 0, 2) + field(4, 2, rank(0, 3)) + field(4, 2, rank(1, 4))
        write("worker_response", f"{runtime}_loads", bytes([bit | 3 << 2]) + loads)
    embed = field(4, 0, 3) + field(5, 2, floats([0.6, 0.0, 0.8])) + field(6, 0, 5)
    write("worker_response", "sglang_embed", bytes([1 | 4 << 2]) + embed)

def tiny_tokenizer_json():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(["hello world, the cat sat on the mat."] * 4, trainer)
    # Compact JSON: a smaller seed the fuzzer mutates faster.
    return json.dumps(json.loads(tokenizer.to_str()), separators=(",", ":"))


# tokenizer_archive: zips shaped like a worker's GetTokenizer answer.
def tokenizer_archive():
    tokenizer_json = tiny_tokenizer_json()
    config = {
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                         "<|im_start|>assistant\n{% endif %}",
    }

    def archive(files, compression=zipfile.ZIP_DEFLATED):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression) as out:
            for name, text in files:
                info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
                info.compress_type = compression
                out.writestr(info, text)
        return buffer.getvalue()

    write("tokenizer_archive", "flat", archive([
        ("tokenizer.json", tokenizer_json),
        ("tokenizer_config.json", json.dumps(config)),
        ("generation_config.json", json.dumps({"eos_token_id": [2]})),
    ]))
    write("tokenizer_archive", "nested_stored", archive([
        ("model/tokenizer.json", tokenizer_json),
        ("model/special_tokens_map.json", json.dumps({"eos_token": {"content": "<|im_end|>"}})),
        ("model/chat_template.jinja", config["chat_template"]),
        ("model/preprocessor_config.json",
         (ROOT / "tests/fixtures/model/preprocessor_config.json").read_text()),
    ], zipfile.ZIP_STORED))


# chat_template: template sources.
def chat_template():
    for name, directory in [("qwen2vl", "tests/fixtures/model"),
                            ("llama3", "tests/fixtures/models/llama3")]:
        config = json.loads((ROOT / directory / "tokenizer_config.json").read_text())
        write("chat_template", name, config["chat_template"])
    write("chat_template", "loops",
          "{%- for m in messages -%}{{ loop.index }}:{{ m.role | upper }}"
          "{%- if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function | tojson }}"
          "{% endfor %}{% endif %}{{ m.content if m.content is string else "
          "m.content[0].text }}{% endfor %}{{ tools | tojson(indent=2) }}")
    write("chat_template", "methods",
          "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
          "{{ (m.content or '') | string | trim | replace('a', 'b') }}"
          "{{ m.role.startswith('us') }}{{ m.role.split('s') }}{% endfor %}"
          "{% if ns.n > 9 %}{{ raise_exception('too many') }}{% endif %}"
          "{{ strftime_now('%Y') | length }}{{ eos_token }}{{ enable_thinking }}")
    write("chat_template", "macro",
          "{% macro r(x, d) %}{% if d > 0 %}[{{ r(x, d - 1) }}]{% else %}{{ x }}{% endif %}"
          "{% endmacro %}{{ r(messages[0].content, 3) }}{{ messages[-1]['content'][:2] }}")


# decode_preprocess: the smallest fixture image of each format, plus a GIF
# (recognised, refused) and a truncated PNG.
def decode_preprocess():
    images = ROOT / "dataplane/tests/fixtures/images"
    for name in ["tiny_20x20.png", "gray16_48x40.png", "palette_97x61.png",
                 "tiny_9x7.jpg", "exif_rot90_200x120.jpg", "lossy_320x240.webp"]:
        shutil.copyfile(images / name, CORPUS / "decode_preprocess" / name)
    png = (images / "tiny_20x20.png").read_bytes()
    write("decode_preprocess", "truncated.png", png[: len(png) // 2])
    write("decode_preprocess", "tiny.gif",
          b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00"
          b"\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


if __name__ == "__main__":
    if CORPUS.exists():
        shutil.rmtree(CORPUS)
    (CORPUS / "decode_preprocess").mkdir(parents=True)
    request_json()
    detokenize()
    worker_response()
    worker_answers()
    tokenizer_archive()
    chat_template()
    decode_preprocess()
