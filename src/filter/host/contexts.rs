//! proxy-wasm's contexts mapped onto the filter: the root context is [`Root`], each HTTP
//! context a [`Stream`], both on the [`Envoy`] host; a [`Flow`] becomes proxy-wasm's `Action`.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

use super::Flow;
use super::envoy::Envoy;
use crate::filter::root::Root;
use crate::filter::stream::Stream;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::new(Envoy)) });
}}

fn action(flow: Flow) -> Action {
    match flow {
        Flow::Continue => Action::Continue,
        Flow::Pause => Action::Pause,
    }
}

impl Context for Root<Envoy> {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        self.on_call_answer(token, body_size);
    }
}

impl RootContext for Root<Envoy> {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        self.configure()
    }

    fn on_tick(&mut self) {
        self.tick();
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(self.new_stream()?))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

impl Context for Stream<Envoy> {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        self.on_call_answer(token, body_size);
    }
}

impl HttpContext for Stream<Envoy> {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        action(self.on_request_headers(end_of_stream))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        action(self.on_request_body(body_size, end_of_stream))
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        action(self.on_request_trailers())
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        action(self.on_response_headers(end_of_stream))
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        action(self.on_response_body(body_size, end_of_stream))
    }

    fn on_log(&mut self) {
        self.on_stream_end();
    }
}
