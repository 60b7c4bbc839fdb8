#![no_main]

libfuzzer_sys::fuzz_target!(
    |case: pinroute_fuzz::resolve::Case| pinroute_fuzz::resolve::check(&case)
);
