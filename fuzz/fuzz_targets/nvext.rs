#![no_main]

libfuzzer_sys::fuzz_target!(|body: pinroute_fuzz::nvext::Body| pinroute_fuzz::nvext::check(&body));
