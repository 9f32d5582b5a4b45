//! The conformance suite on the in-memory backend (no server needed).

conformance_tests::conformance_suite!(memory, conformance_tests::memory::harness);
