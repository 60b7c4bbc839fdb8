"""The OpenAI and Anthropic Python SDKs against the gateway over HTTPS (tests/e2e/sdk.rs).

argv: gateway URL (https://host:port), CA file, a listed API key. Prints one JSON object: what
each call got.
"""

import json
import sys

import anthropic
import openai

gateway, ca_file, key = sys.argv[1:4]
PROMPT = "The quick brown fox jumps over the lazy dog and keeps running far away"
seen = {}


def workers(raw):
    return {
        "status": raw.status_code,
        "prefill": raw.headers.get("x-pinroute-prefill-worker"),
        "decode": raw.headers.get("x-pinroute-decode-worker"),
    }


def openai_calls():
    http_client = openai.DefaultHttpxClient(verify=ca_file)
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, http_client=http_client, max_retries=0)

    raw = client.completions.with_raw_response.create(model="sim-model", prompt="hello", max_tokens=4)
    seen["completion"] = workers(raw) | {"text": raw.parse().choices[0].text}

    stream = client.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=4,
        stream=True,
        extra_headers={"x-dynamo-worker-instance-id": "202"},
    )
    seen["chat_stream"] = {"chunks": sum(1 for _ in stream)}

    try:
        client.completions.create(
            model="sim-model", prompt="hi", max_tokens=1, extra_headers={"x-dynamo-worker-instance-id": "999"}
        )
    except openai.BadRequestError as error:
        seen["bad_pin"] = {"status": error.status_code, "code": error.code}

    stranger = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-not-listed", http_client=http_client, max_retries=0)
    try:
        stranger.models.list()
    except openai.AuthenticationError as error:
        seen["unlisted_key"] = {"status": error.status_code, "code": error.code}

    raw = client.responses.with_raw_response.create(model="sim-model", input=PROMPT, max_output_tokens=4)
    response = raw.parse()
    seen["response"] = workers(raw) | {"id": response.id, "text": response.output_text}

    raw = client.responses.with_raw_response.create(
        model="sim-model", input="and then?", previous_response_id=response.id, max_output_tokens=3
    )
    seen["follow_up"] = workers(raw) | {"previous": raw.parse().previous_response_id}

    raw = client.responses.with_raw_response.retrieve(response.id)
    seen["retrieved"] = workers(raw) | {"id": raw.parse().id, "text": raw.parse().output_text}

    events = client.responses.create(
        model="sim-model", input=PROMPT, max_output_tokens=3, stream=True, extra_headers={"x-dynamo-worker-instance-id": "201"}
    )
    seen["response_stream"] = {"events": [event.type for event in events]}

    try:
        client.responses.create(model="sim-model", input="x", previous_response_id="resp_made_elsewhere")
    except openai.NotFoundError as error:
        seen["unknown_previous"] = {"status": error.status_code, "code": error.code}


def anthropic_calls():
    http_client = anthropic.DefaultHttpxClient(verify=ca_file)
    client = anthropic.Anthropic(base_url=gateway, api_key=key, http_client=http_client, max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]

    raw = client.messages.with_raw_response.create(
        model="sim-model",
        max_tokens=4,
        system="Answer briefly.",
        messages=messages,
        extra_headers={"x-dynamo-worker-instance-id": "201"},
    )
    message = raw.parse()
    seen["message"] = workers(raw) | {"text": message.content[0].text, "stop_reason": message.stop_reason}

    with client.messages.stream(model="sim-model", max_tokens=4, messages=messages) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    seen["message_stream"] = {"text": text, "stop_reason": final.stop_reason}

    seen["count_tokens"] = {"input_tokens": client.messages.count_tokens(model="sim-model", messages=messages).input_tokens}

    try:
        client.messages.create(
            model="sim-model", max_tokens=4, messages=messages, extra_headers={"x-dynamo-worker-instance-id": "999"}
        )
    except anthropic.BadRequestError as error:
        seen["message_bad_pin"] = {"status": error.status_code, "type": error.body["error"]["type"], "code": error.body["error"]["code"]}

    stranger = anthropic.Anthropic(base_url=gateway, api_key="sk-not-listed", http_client=http_client, max_retries=0)
    try:
        stranger.messages.create(model="sim-model", max_tokens=4, messages=messages)
    except anthropic.AuthenticationError as error:
        seen["message_unlisted_key"] = {"status": error.status_code}


openai_calls()
anthropic_calls()
print(json.dumps(seen))
