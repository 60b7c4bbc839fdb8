"""The OpenAI Python SDK against the gateway over HTTPS (tests/e2e/sdk.rs).

argv: base URL, CA file, a listed API key. Prints one JSON object: what each call got.
"""

import json
import sys

import openai

base_url, ca_file, key = sys.argv[1:4]
http_client = openai.DefaultHttpxClient(verify=ca_file)
client = openai.OpenAI(base_url=base_url, api_key=key, http_client=http_client, max_retries=0)
seen = {}

raw = client.completions.with_raw_response.create(model="sim-model", prompt="hello", max_tokens=4)
completion = raw.parse()
seen["completion"] = {
    "status": raw.status_code,
    "prefill": raw.headers.get("x-pinroute-prefill-worker"),
    "decode": raw.headers.get("x-pinroute-decode-worker"),
    "text": completion.choices[0].text,
}

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

stranger = openai.OpenAI(base_url=base_url, api_key="sk-not-listed", http_client=http_client, max_retries=0)
try:
    stranger.models.list()
except openai.AuthenticationError as error:
    seen["unlisted_key"] = {"status": error.status_code, "code": error.code}

print(json.dumps(seen))
