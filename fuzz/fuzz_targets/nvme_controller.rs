#![no_main]
//! cargo-fuzz entry point; the harness and its properties live in `ipsan_fuzz::nvme_controller`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ipsan_fuzz::nvme_controller(data));
