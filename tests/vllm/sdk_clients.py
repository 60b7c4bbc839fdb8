"""The OpenAI and Anthropic Python SDKs against the gateway in front of a real vLLM pair
(tests/vllm/scenarios.rs): the Responses API and Anthropic's Messages API, streamed and not.

argv: gateway URL (http://host:port), the served model name, a prompt of at least 70 tokens.
Prints one JSON object: for each call, its status, the workers of its hops and what it read.
"""

import json
import sys

import anthropic
import openai

gateway, model, prompt = sys.argv[1:4]
PIN = {"x-dynamo-worker-instance-id": "201"}
seen = {}


def hops(raw):
    return {
        "status": raw.status_code,
        "prefill": raw.headers.get("x-pinroute-prefill-worker"),
        "decode": raw.headers.get("x-pinroute-decode-worker"),
    }


responses = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)
raw = responses.responses.with_raw_response.create(
    model=model, input=f"[responses] {prompt}", max_output_tokens=8, temperature=0, extra_headers=PIN
)
seen["response"] = hops(raw) | {"text": raw.parse().output_text}

raw = responses.responses.with_raw_response.create(
    model=model, input=f"[responses stream] {prompt}", max_output_tokens=8, temperature=0, stream=True, extra_headers=PIN
)
events = [event.type for event in raw.parse()]
seen["response_stream"] = hops(raw) | {"deltas": events.count("response.output_text.delta"), "last": events[-1]}

messages = anthropic.Anthropic(base_url=gateway, api_key="unused", max_retries=0)
raw = messages.messages.with_raw_response.create(
    model=model,
    max_tokens=8,
    extra_body={"temperature": 0},
    messages=[{"role": "user", "content": f"[messages] {prompt}"}],
    extra_headers=PIN,
)
seen["message"] = hops(raw) | {"text": raw.parse().content[0].text}

raw = messages.messages.with_raw_response.create(
    model=model,
    max_tokens=8,
    extra_body={"temperature": 0},
    messages=[{"role": "user", "content": f"[messages stream] {prompt}"}],
    stream=True,
    extra_headers=PIN,
)
events = [event.type for event in raw.parse()]
seen["message_stream"] = hops(raw) | {"deltas": events.count("content_block_delta"), "last": events[-1]}

print(json.dumps(seen))
