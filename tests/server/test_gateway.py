"""Replicas of the bundled model behind the real gateways (smg, vllm-router) on loopback, driven by the official
openai client: answers through the gateway equal a replica's own (same seed), streamed or not; cache_aware
routing keeps each conversation on one replica and at least doubles round_robin's prefix-cache hit rate
(summed from the replicas' /metrics); power_of_two sends fewer requests to a replica held to one sequence per
step; no process is left behind."""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.server.gateway_harness import Server, assert_no_strays, family, start_gateway, start_replicas, stop

pytestmark = pytest.mark.slow  # four replicas and the gateways: about a minute on 2 cores

MODEL = "default-model"
SAMPLED = {"temperature": 0.8, "seed": 7, "max_tokens": 24}
TURNS, CONVERSATIONS = 5, 8


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Server]]:
    """Three bundled-model replicas and a fourth held to one sequence per step (the slow one), last."""
    servers = start_replicas([[], [], [], ["--max-num-seqs", "1"]])
    pids = set().union(*(family(s.pid) for s in servers))
    yield servers
    stop(servers)
    assert_no_strays(pids)


@pytest.fixture
def gateway(request: pytest.FixtureRequest, replicas: list[Server]) -> Iterator[Server]:
    """`request.param` = (gateway, policy, replica indices)."""
    name, policy, indices = request.param
    server = start_gateway(name, policy, [replicas[i] for i in indices])
    pids = family(server.pid)
    yield server
    stop([server])
    assert_no_strays(pids)


def _answers(server: Server) -> list[str]:
    """Chat and completions, whole and streamed, at temperature 0.8 with a seed."""
    c = client(server)
    messages = [{"role": "user", "content": "What is 27+15?"}]
    chat = c.chat.completions.create(model=MODEL, messages=messages, **SAMPLED)  # type: ignore[arg-type]
    chat_stream = c.chat.completions.create(model=MODEL, messages=messages, stream=True, **SAMPLED)  # type: ignore[arg-type]
    text = c.completions.create(model=MODEL, prompt="Once upon a time", **SAMPLED)
    text_stream = c.completions.create(model=MODEL, prompt="Once upon a time", stream=True, **SAMPLED)
    return [
        chat.choices[0].message.content or "",
        "".join(chunk.choices[0].delta.content or "" for chunk in chat_stream if chunk.choices),
        text.choices[0].text,
        "".join(chunk.choices[0].text for chunk in text_stream if chunk.choices),
    ]


@pytest.mark.parametrize(
    "gateway", [("smg", "round_robin", (0, 1)), ("vllm-router", "round_robin", (0, 1))], indirect=True
)
def test_answers_through_the_gateway_equal_a_replicas(gateway: Server, replicas: list[Server]):
    direct = _answers(replicas[0])
    assert direct[0] == direct[1] and direct[2] == direct[3] and all(direct)  # whole = streamed
    assert _answers(gateway) == direct
    assert [m.id for m in client(gateway).models.list().data] == [MODEL]


def _conversations(seed: int) -> list[list[list[dict[str, str]]]]:
    """CONVERSATIONS conversations of TURNS requests; each turn repeats the previous ones (a growing shared
    prefix) and adds a user message and a fixed assistant answer of ~60 bytes (the model is byte-level)."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join("".join(rng.choices(string.ascii_lowercase, k=5)) for _ in range(n))

    result = []
    for _ in range(CONVERSATIONS):
        history = [{"role": "system", "content": words(12)}]
        turns = []
        for _ in range(TURNS):
            history = [*history, {"role": "user", "content": words(10)}]
            turns.append(history)
            history = [*history, {"role": "assistant", "content": words(10)}]
        result.append(turns)
    return result


def _routing_run(gateway: Server, replicas: list[Server], seed: int) -> tuple[float, list[set[int]]]:
    """Turn t of every conversation, then turn t + 1, ...: the prefix-cache hit rate summed over `replicas`, and
    the replicas each conversation was served by (seen as a replica's finished-request counter moving)."""
    before = [(r.metric("prefix_cache_hits_total"), r.metric("prefix_cache_queries_total")) for r in replicas]
    served: list[set[int]] = [set() for _ in range(CONVERSATIONS)]
    conversations = _conversations(seed)
    c = client(gateway)
    for turn in range(TURNS):
        for i, conversation in enumerate(conversations):
            counts = [r.metric("request_success_total") for r in replicas]
            c.chat.completions.create(model=MODEL, messages=conversation[turn], max_tokens=4, temperature=0)  # type: ignore[arg-type]
            served[i] |= {j for j, r in enumerate(replicas) if r.metric("request_success_total") > counts[j]}
    hits = sum(r.metric("prefix_cache_hits_total") - b[0] for r, b in zip(replicas, before))
    queries = sum(r.metric("prefix_cache_queries_total") - b[1] for r, b in zip(replicas, before))
    return hits / queries, served


def test_cache_aware_keeps_conversations_on_one_replica_and_doubles_prefix_hits(replicas: list[Server]):
    rates = {}
    for policy, seed in (("round_robin", 1), ("cache_aware", 2)):  # other texts: no hit from the other run
        gateway = start_gateway("smg", policy, replicas[:3])
        try:
            rates[policy], served = _routing_run(gateway, replicas[:3], seed)
        finally:
            stop([gateway])
        if policy == "round_robin":
            assert all(len(s) >= 2 for s in served)  # 8 conversations a turn over 3 replicas: each one moves
        else:
            assert all(len(s) == 1 for s in served), served
    print(f"prefix-cache hit rate over 3 replicas: {rates}")
    assert rates["cache_aware"] >= 2 * rates["round_robin"]


@pytest.mark.parametrize("gateway", [("smg", "power_of_two", (0, 3))], indirect=True)
def test_power_of_two_spares_a_slow_replica(gateway: Server, replicas: list[Server]):
    fast, slow = replicas[0], replicas[3]
    before = [fast.metric("request_success_total"), slow.metric("request_success_total")]
    body = {"model": MODEL, "prompt": "Count: 1 2 3", "max_tokens": 48, "extra_body": {"ignore_eos": True}}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: client(gateway).completions.create(**body), range(24)))  # type: ignore[arg-type]
    counts = [fast.metric("request_success_total") - before[0], slow.metric("request_success_total") - before[1]]
    print(f"power_of_two: fast replica {counts[0]:.0f} requests, slow replica {counts[1]:.0f}")
    assert sum(counts) == 24 and counts[1] < counts[0]
