#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pinroute_fuzz::metrics_page::check(data));
