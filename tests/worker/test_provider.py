"""The loopback provider speaks OpenAI's chat completions as the openai SDK reads them: blocking and streamed
answers with usage, tool calls, structured answers, failures, slow and hanging calls, and it records every
call and every client that hung up. Real HTTP (httpx) against the real server; CrewAI is not needed here
(tests/worker/test_provider_crews.py runs CrewAI's own LLM class against it)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.scripted_provider import scripted_provider
from worker import provider as provider_module
from worker.provider import Provider

MESSAGES = [{"role": "system", "content": "You are a tester."}, {"role": "user", "content": "Say something."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look it up.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}},
        },
    }
]


@pytest.fixture
def provider() -> Iterator[Provider]:
    with scripted_provider() as running:
        yield running


def post(provider: Provider, model: str = "answer", **body: Any) -> httpx.Response:
    return httpx.post(
        f"{provider.url}/chat/completions", json={"model": model, "messages": MESSAGES, **body}, timeout=30
    )


def raw(provider: Provider) -> socket.socket:
    host, port = provider.url.removeprefix("http://").removesuffix("/v1").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def events(response: httpx.Response) -> list[Any]:
    """The SSE data of a streamed answer, ``[DONE]`` last."""
    datas = [line[len("data: ") :] for line in response.text.split("\n") if line.startswith("data: ")]
    return [json.loads(data) if data != "[DONE]" else data for data in datas]


def test_a_blocking_answer_has_the_shape_the_sdk_reads_and_is_the_same_for_the_same_prompt(provider: Provider) -> None:
    first, again = post(provider).json(), post(provider).json()
    assert first == again
    assert first["object"] == "chat.completion"
    (choice,) = first["choices"]
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].startswith("Thought: I know the answer.\nFinal Answer: ")
    usage = first["usage"]
    assert usage["prompt_tokens"] == 6 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    other = httpx.post(
        f"{provider.url}/chat/completions", json={"model": "answer", "messages": MESSAGES[:1]}, timeout=30
    ).json()
    assert other["choices"][0]["message"]["content"] != choice["message"]["content"]
    assert [(call.model, call.stream, call.status) for call in provider.calls] == [("answer", False, 200)] * 3


def test_a_streamed_answer_is_sse_word_by_word_with_a_usage_chunk_only_when_asked(provider: Provider) -> None:
    blocking = post(provider).json()
    streamed = post(provider, stream=True, stream_options={"include_usage": True})
    assert streamed.headers["content-type"] == "text/event-stream"
    *chunks, done = events(streamed)
    assert done == "[DONE]"
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    assert text == blocking["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == blocking["usage"]
    without = events(post(provider, stream=True))
    assert all(chunk == "[DONE]" or chunk["choices"] for chunk in without)
    assert provider.calls[1].stream


def test_offered_tools_are_called_once_then_answered_and_loop_calls_them_every_turn(provider: Provider) -> None:
    call = post(provider, tools=TOOLS).json()["choices"][0]
    assert call["finish_reason"] == "tool_calls"
    (tool_call,) = call["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "lookup"
    assert set(json.loads(tool_call["function"]["arguments"])) == {"query", "limit"}
    answered = [*MESSAGES, call["message"], {"role": "tool", "tool_call_id": tool_call["id"], "content": "found"}]
    final = httpx.post(
        f"{provider.url}/chat/completions", json={"model": "answer", "messages": answered, "tools": TOOLS}, timeout=30
    )
    assert final.json()["choices"][0]["finish_reason"] == "stop"
    again = httpx.post(
        f"{provider.url}/chat/completions", json={"model": "loop", "messages": answered, "tools": TOOLS}, timeout=30
    )
    assert again.json()["choices"][0]["finish_reason"] == "tool_calls"
    streamed = events(post(provider, stream=True, tools=TOOLS))
    deltas = [chunk["choices"][0]["delta"] for chunk in streamed[:-1] if chunk["choices"]]
    arguments = "".join(d["tool_calls"][0]["function"].get("arguments", "") for d in deltas if "tool_calls" in d)
    assert json.loads(arguments) == json.loads(tool_call["function"]["arguments"])
    assert provider.calls[0].tools == ["lookup"]


def test_scripted_replies_come_in_order_per_model_then_the_spent_script_says_so(provider: Provider) -> None:
    lookup = {"tool_calls": [{"name": "lookup", "arguments": {"query": "tides at Brest", "limit": 3}}]}
    provider.script([lookup, {"content": "High tide is at 06:12."}])  # any model
    provider.script([{"status": 429, "message": "slow down"}], model="other")
    called = post(provider, "m", tools=TOOLS).json()["choices"][0]
    assert called["finish_reason"] == "tool_calls"
    (tool_call,) = called["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "lookup"
    assert json.loads(tool_call["function"]["arguments"]) == {"query": "tides at Brest", "limit": 3}
    refused = post(provider, "other")
    assert refused.status_code == 429 and refused.json()["error"]["message"] == "slow down"
    assert post(provider, "m").json()["choices"][0]["message"]["content"] == "High tide is at 06:12."
    spent = post(provider, "m")
    assert spent.status_code == 400 and "no reply left" in spent.json()["error"]["message"]
    assert [call.status for call in provider.calls] == [200, 429, 200, 400]
    provider.reset()
    assert provider.calls == [] and post(provider, "m").json()["choices"][0]["message"]["content"].startswith("Thought")


def test_a_streamed_tool_call_sends_its_arguments_in_pieces_as_real_providers_do(provider: Provider) -> None:
    arguments = {"query": "the times of high tide at Brest", "limit": 3}
    provider.script([{"tool_calls": [{"name": "lookup", "arguments": arguments}]}])
    deltas = [chunk["choices"][0]["delta"] for chunk in events(post(provider, stream=True))[:-1]]
    calls = [delta["tool_calls"][0] for delta in deltas if "tool_calls" in delta]
    assert calls[0]["function"] == {"name": "lookup", "arguments": ""} and calls[0]["id"] and len(calls) > 4
    assert json.loads("".join(call["function"]["arguments"] for call in calls)) == arguments


def test_scripts_and_calls_are_reachable_over_http_and_bad_scripts_are_refused(provider: Provider) -> None:
    root = provider.url.removesuffix("/v1")
    queued = httpx.post(f"{root}/scripts", json={"model": "m", "replies": [{"content": "yes"}]}, timeout=30)
    assert queued.json() == {"model": "m", "queued": 1}
    assert post(provider, "m").json()["choices"][0]["message"]["content"] == "yes"
    (call,) = httpx.get(f"{root}/calls", timeout=30).json()["calls"]
    assert call["model"] == "m" and call["messages"] == MESSAGES and call["status"] == 200
    for bad in ({"replies": [{"content": 1}]}, {"replies": [{"status": 200}]}, {"model": 3, "replies": []}, []):
        refused = httpx.post(f"{root}/scripts", json=bad, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["message"], bad
    assert httpx.delete(f"{root}/scripts", timeout=30).status_code == 200 and provider.calls == []


def test_a_response_format_gets_json_that_fits_its_schema(provider: Provider) -> None:
    schema = {
        "type": "object",
        "properties": {
            "verdict": {"$ref": "#/$defs/Verdict"},
            "score": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
        },
        "$defs": {"Verdict": {"enum": ["pass", "fail"]}},
    }
    answer = post(provider, response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": schema}})
    content = json.loads(answer.json()["choices"][0]["message"]["content"])
    assert content["verdict"] == "pass" and content["score"] == 8.0
    assert isinstance(content["tags"][0], str) and isinstance(content["note"], str)


@pytest.mark.parametrize("status", [429, 500])
def test_a_failing_call_answers_its_status_with_an_openai_error(provider: Provider, status: int) -> None:
    answer = post(provider, f"fail-{status}")
    assert answer.status_code == status
    assert answer.json()["error"]["message"] == f"the provider answered {status}"
    assert provider.calls[0].status == status


def test_the_shipped_provider_knows_only_what_warm_up_demo_and_bench_use() -> None:
    """Failures, tool loops and long answers are the tests' directives: shipped, they answer as ``answer`` does."""
    answered = [*MESSAGES, {"role": "tool", "tool_call_id": "call_x", "content": "found"}]
    with Provider() as shipped:
        answer = post(shipped).json()["choices"][0]["message"]
        for script in ("fail-500", "words-3", "loop"):
            assert post(shipped, script).json()["choices"][0]["message"] == answer
        loop = post(shipped, "loop", messages=answered, tools=TOOLS).json()
        assert loop["choices"][0]["finish_reason"] == "stop"


def test_a_long_answer_is_n_words_longer_and_streams_a_word_a_chunk(provider: Provider) -> None:
    short = post(provider).json()["choices"][0]["message"]["content"]
    assert post(provider, "words-3").json()["choices"][0]["message"]["content"] == f"{short} w0 w1 w2"
    streamed = events(post(provider, "words-3", stream=True))
    assert [chunk["choices"][0]["delta"].get("content") for chunk in streamed[-5:-2]] == ["w0 ", "w1 ", "w2"]


def test_a_slow_call_answers_no_sooner_than_its_delay(provider: Provider) -> None:
    answer = post(provider, "slow-300+fail-500")  # directives join with +
    assert answer.status_code == 500
    # Recorded once the answer is written, so a moment after the client has read it: waited for, not assumed.
    (call,) = provider.wait(lambda calls: len(calls) == 1 and calls[0].answered is not None, 30)
    assert call.answered is not None and call.answered - call.started >= 0.3


def test_a_hanging_call_records_when_its_client_hangs_up(provider: Provider) -> None:
    body = json.dumps({"model": "hang", "messages": MESSAGES}).encode()
    client = raw(provider)
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    client.sendall(head.encode() + body)
    provider.wait(lambda calls: len(calls) == 1, 30)
    assert provider.calls[0].hung_up is None
    closed = time.monotonic()
    client.close()
    (call,) = provider.wait(lambda calls: calls[0].hung_up is not None, 30)
    assert call.hung_up is not None and call.hung_up >= closed and call.answered is None


def test_stopping_ends_a_hanging_call_and_leaves_no_thread() -> None:
    before = set(threading.enumerate())
    provider = Provider().start()
    outcome: list[Any] = []
    hanging = threading.Thread(target=lambda: outcome.append(_try(lambda: post(provider, "hang"))))
    hanging.start()
    provider.wait(lambda calls: len(calls) == 1, 30)
    provider.stop()
    hanging.join(30)
    assert not hanging.is_alive()
    assert isinstance(outcome[0], httpx.HTTPError)  # the connection closed unanswered
    assert provider.calls[0].answered is None
    assert set(threading.enumerate()) == before


def _try(call: Any) -> Any:
    try:
        return call()
    except Exception as exc:
        return exc


def test_bad_requests_get_clear_answers(provider: Provider) -> None:
    assert httpx.post(f"{provider.url}/embeddings", json={}, timeout=30).status_code == 404
    bad = httpx.post(f"{provider.url}/chat/completions", content=b"{not json", timeout=30)
    assert bad.status_code == 400 and "model and messages" in bad.json()["error"]["message"]
    with raw(provider) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n{}")
        assert client.recv(4096).startswith(b"HTTP/1.1 413 ")
    assert provider.calls == []


@pytest.mark.parametrize(
    ("length", "status"), [(b"abc", 400), (b"-5", 400), (b"1e3", 400), (b"9" * 5000, 413), (b"16777217", 413)]
)
def test_a_content_length_that_is_no_byte_count_or_too_large_is_answered_at_once(
    provider: Provider, length: bytes, status: int
) -> None:
    with raw(provider) as client:
        client.settimeout(10)  # a handler reading a body of -5 bytes would wait for the client to hang up
        client.sendall(b"POST /scripts HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n{}")
        answer = b""
        while chunk := client.recv(65536):  # it closes the connection: where a next request begins is unknown
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), head
    assert json.loads(body)["error"]["message"].startswith("Content-Length" if status == 400 else "a body of")


def test_scripts_of_too_many_models_are_refused(provider: Provider) -> None:
    for number in range(provider_module.MAX_SCRIPTED_MODELS):
        provider.script([{"content": "yes"}], f"m{number}")
    root = provider.url.removesuffix("/v1")
    refused = httpx.post(f"{root}/scripts", json={"model": "one-more", "replies": []}, timeout=30)
    assert refused.status_code == 400
    bound = provider_module.MAX_SCRIPTED_MODELS
    assert refused.json()["error"]["message"] == f"at most {bound} models have a script at once"
    assert httpx.post(f"{root}/scripts", json={"model": "m0", "replies": [{"content": "again"}]}, timeout=30).is_success


def test_only_the_most_recent_calls_are_kept(provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded in number and in bytes, while every call is still answered (the demo's provider is never reset)."""
    monkeypatch.setattr(provider_module, "MAX_CALLS", 3)
    assert all(post(provider).status_code == 200 for _ in range(5))
    assert [call.index for call in provider.calls] == [2, 3, 4]
    monkeypatch.setattr(provider_module, "MAX_RECORDED_BYTES", provider.calls[0].size * 2)
    assert post(provider).status_code == 200
    assert [call.index for call in provider.calls] == [4, 5]
    provider.reset()
    assert post(provider).status_code == 200 and [call.index for call in provider.calls] == [0]


def test_wait_gives_up_at_its_deadline(provider: Provider) -> None:
    with pytest.raises(TimeoutError):
        provider.wait(lambda calls: bool(calls), 0.2)
