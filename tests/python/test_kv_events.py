"""Issue 26: Pagoda's KV-cache events read by vLLM's own consumer code path.

The structs below are laid out as `vllm/distributed/kv_events.py` declares them
(msgspec; the batch `array_like=True`, the events `tag=True` maps), decoded with `msgspec.msgpack.Decoder`
from a `pyzmq` SUB socket, and the replay is asked for as routers ask (a DEALER
sending the start sequence number). msgspec refuses a payload with a field
missing, of the wrong type, or a tag it does not know.
"""

import socket
import time

import msgspec
import pytest
import requests
import zmq

from conftest import _model_path, running_server


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def kv_server(monkeypatch):
    pub, rep = _port(), _port()
    cfg = (
        '{"enable_kv_cache_events": true, "publisher": "zmq", '
        f'"endpoint": "tcp://*:{pub}", "replay_endpoint": "tcp://*:{rep}", "topic": "kv-events"}}'
    )
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    args = ["--model", str(_model_path()), "--num-kv-blocks", "24", "--kv-events-config", cfg]
    with running_server(args, log_prefix="pagoda-kv-") as base:
        yield base, pub, rep


def _complete(base, prompt):
    r = requests.post(
        base + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 4, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text


def test_events_decode_with_vllms_structs_and_replay(kv_server):
    base, pub, rep = kv_server
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{pub}")
    sub.setsockopt_string(zmq.SUBSCRIBE, "kv-events")
    time.sleep(0.5)  # the slow joiner: let the subscription reach the publisher
    prompts = [
        f"User {i} wants a short story about a lighthouse keeper, a storm at sea, a lost "
        f"ship and the light that brought its sailors home, told in three short parts, "
        f"with a title and a moral at the end, number {i}."
        for i in range(10)
    ]
    for p in prompts:
        _complete(base, p)
    assert requests.post(base + "/reset_prefix_cache", timeout=30).status_code == 200
    _complete(base, prompts[0])

    live = {}
    while sub.poll(3000):
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv-events"
        live[int.from_bytes(seq, "big")] = payload
    assert live, "no batch arrived on the SUB socket"

    # The replay as a router asks for it: a DEALER sends ["", start seq]; the
    # answer is ["", seq, payload] per buffered batch, ended by seq -1 and "".
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{rep}")
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = {}
    while True:
        assert dealer.poll(10000), "the replay did not answer"
        empty, seq, payload = dealer.recv_multipart()
        assert empty == b""
        if int.from_bytes(seq, "big", signed=True) == -1:
            assert payload == b""
            break
        replayed[int.from_bytes(seq, "big")] = payload
    assert sorted(replayed) == list(range(len(replayed)))
    for seq, payload in live.items():
        assert replayed[seq] == payload

    cached = {}
    kinds = set()
    for seq in sorted(replayed):
        batch = decoder.decode(replayed[seq])
        assert batch.data_parallel_rank == 0 and batch.ts > 1.6e9
        for e in batch.events:
            kinds.add(type(e).__name__)
            if isinstance(e, BlockStored):
                assert e.block_size == 16 and e.medium == "GPU"
                assert len(e.token_ids) == 16 * len(e.block_hashes)
                if e.parent_block_hash is not None:
                    assert e.parent_block_hash in cached
                for h in e.block_hashes:
                    assert h not in cached
                    cached[h] = True
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    assert cached.pop(h)
            else:
                cached.clear()
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}, kinds
    ctx.destroy(linger=0)
