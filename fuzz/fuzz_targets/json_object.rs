#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pinroute_fuzz::json_object::check(data));
