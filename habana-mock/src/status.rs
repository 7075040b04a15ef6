//! Short descriptions of `synStatus` codes (synStatusGetBriefDescription, synGetErrorString).
//!
//! Owns: the static description strings. Must not touch: anything else.

use std::ffi::CStr;

use habana_sys::synStatus;

const DESCRIPTIONS: [&CStr; 48] = [
    c"success",
    c"invalid argument",
    c"command buffer full",
    c"out of host memory",
    c"out of device memory",
    c"object already initialized",
    c"object not initialized",
    c"command submission failure",
    c"no device found",
    c"device type mismatch",
    c"failed to initialize command buffer",
    c"failed to free command buffer",
    c"failed to map command buffer",
    c"failed to unmap command buffer",
    c"failed to allocate device memory",
    c"failed to free device memory",
    c"not enough devices found",
    c"device reset",
    c"unsupported",
    c"wrong parameters file",
    c"device already acquired",
    c"name is already used",
    c"busy",
    c"all resources taken",
    c"unavailable",
    c"invalid tensor dimensions",
    c"failure",
    c"out of resources",
    c"uninitialized",
    c"already initialized",
    c"failed section validation",
    c"synapse terminated",
    c"asynchronous assert",
    c"invalid event handle",
    c"mapping not found",
    c"failed dynamic patching",
    c"failed static patching",
    c"failed to submit workload",
    c"invalid sections definition",
    c"invalid tensor properties",
    c"HCCL failure",
    c"failed to collect time",
    c"timeout",
    c"resource bad usage",
    c"null pointer",
    c"fuser failure",
    c"complex GUID failure",
    c"TPC kernels failure",
];

/// The brief description of `s` ("unknown status" for codes this crate does not know).
pub fn brief(s: synStatus) -> &'static CStr {
    usize::try_from(s.0).ok().and_then(|i| DESCRIPTIONS.get(i)).copied().unwrap_or(c"unknown status")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_follow_the_code_names() {
        // Each description, with spaces removed, must appear in the C name (case-insensitive),
        // except the few abbreviated ones: catches an off-by-one in the table.
        for code in 0..48 {
            let s = synStatus(code);
            let name = s.name().unwrap().to_lowercase();
            let d = brief(s).to_str().unwrap().replace(' ', "").to_lowercase();
            let abbreviated = [
                "commandbufferfull",
                "failedtoinitializecommandbuffer",
                "failedtofreecommandbuffer",
                "failedtomapcommandbuffer",
                "failedtounmapcommandbuffer",
                "notenoughdevicesfound",
                "wrongparametersfile",
                "asynchronousassert",
                "failure",
                "hcclfailure",
                "nullpointer",
                "fuserfailure",
                "complexguidfailure",
                "tpckernelsfailure",
            ];
            assert!(name.contains(&d) || abbreviated.contains(&d.as_str()), "{code}: {name} vs {d}");
        }
        assert_eq!(brief(synStatus(999)), c"unknown status");
        assert_eq!(brief(synStatus::INVALID_EVENT_HANDLE), c"invalid event handle");
    }
}
