use super::*;
use crate::policy::testing::test;

#[test]
fn each_api_is_found_at_its_own_path_only() {
    for api in Api::ALL {
        assert_eq!(Api::at(api.path()), Some(api));
    }
    for other in [
        "/v1/responses/resp_1",
        "/v1/messages/count_tokens",
        "/inference/v1",
        "/v1",
    ] {
        assert_eq!(Api::at(other), None, "{other}");
    }
}

#[test]
fn anthropic_clients_get_anthropic_errors_below_v1_messages_only() {
    for (path, shape) in [
        ("/v1/messages", ErrorShape::Anthropic),
        ("/v1/messages/count_tokens", ErrorShape::Anthropic),
        ("/v1/messagesx", ErrorShape::OpenAi),
        ("/v1/chat/completions", ErrorShape::OpenAi),
        ("/v1/responses", ErrorShape::OpenAi),
        ("/inference/v1/generate", ErrorShape::OpenAi),
    ] {
        assert_eq!(ErrorShape::of_path(path), shape, "{path}");
    }
}

#[test]
fn each_api_names_its_prompt_and_its_limit() {
    let fields: Vec<_> = Api::ALL
        .into_iter()
        .map(|api| (api.prompt_fields(), api.limit_field()))
        .collect();
    assert_eq!(
        fields,
        [
            (&["prompt"][..], "max_tokens"),
            (&["messages"], "max_tokens"),
            (&["instructions", "input"], "max_output_tokens"),
            (&["system", "messages"], "max_tokens"),
            (&["token_ids"], "sampling_params"),
        ]
    );
}

#[test]
fn the_prompt_is_its_members_as_written_instructions_first() {
    let body =
        |json: &'static str| crate::policy::json::JsonObject::parse(json.as_bytes()).unwrap();
    let messages =
        body(r#"{"messages": [{"role": "user", "content": "hi"}], "system": "be \u0062rief"}"#);
    assert_eq!(
        Api::Messages.prompt(&messages).as_ref(),
        br#""be \u0062rief"[{"role": "user", "content": "hi"}]"#,
        "system first, whatever the body's order"
    );
    let chat = body(r#"{"messages": [1], "system": "ignored by chat"}"#);
    assert!(matches!(
        Api::ChatCompletions.prompt(&chat),
        std::borrow::Cow::Borrowed(b"[1]")
    ));
    let input_only = body(r#"{"input": "x"}"#);
    assert!(matches!(
        Api::Responses.prompt(&input_only),
        std::borrow::Cow::Borrowed(b"\"x\"")
    ));
    assert!(Api::Completions.prompt(&body("{}")).is_empty());
}
