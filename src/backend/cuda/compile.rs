//! The kernels in `kernels/`, embedded in the binary, compiled by NVRTC for the card's compute
//! capability at first use and cached on disk. A cache entry is named by a hash of the source,
//! the architecture, the driver and NVRTC versions, and carries a checksum of its contents: an
//! entry that does not verify, or that the driver refuses, is rebuilt, never trusted.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys as nv;
use sha2::{Digest, Sha256};

use super::device::CudaError;

/// The kernel sources in the order they are compiled as one program.
pub const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../../kernels/common.cuh")),
    ("quants.cuh", include_str!("../../../kernels/quants.cuh")),
    ("matvec.cu", include_str!("../../../kernels/matvec.cu")),
    ("ops.cu", include_str!("../../../kernels/ops.cu")),
    (
        "attention.cu",
        include_str!("../../../kernels/attention.cu"),
    ),
];

const MAGIC: &[u8; 8] = b"BLMCUBN1";

/// All sources as one translation unit, each preceded by a `#line` so NVRTC's messages name the
/// file and line.
pub fn program() -> String {
    let mut s = String::new();
    for (name, text) in SOURCES {
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(text);
        s.push('\n');
    }
    s
}

/// Whether NVRTC can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library by its usual names.
    unsafe { nv::is_culib_present() }
}

pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    check(
        unsafe { nv::nvrtcVersion(&mut major, &mut minor) },
        "nvrtcVersion",
    )?;
    Ok((major, minor))
}

/// What names a cache entry: everything the image depends on.
pub fn cache_key(source: &str, arch: (i32, i32), driver: i32, nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update(
        format!(
            "|sm_{}{}|driver {driver}|nvrtc {}.{}",
            arch.0, arch.1, nvrtc.0, nvrtc.1
        )
        .as_bytes(),
    );
    let d = h.finalize();
    let hex: String = d[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("kernels-sm{}{}-{hex}.cubin", arch.0, arch.1)
}

/// The image in a cache file, if the file is whole and its checksum holds.
pub fn read_entry(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < 40 || &bytes[..8] != MAGIC {
        return None;
    }
    let (sum, image) = bytes[8..].split_at(32);
    (Sha256::digest(image).as_slice() == sum).then(|| image.to_vec())
}

/// Writes a cache entry atomically (a partly written file never carries a valid checksum, and
/// the rename makes it appear whole).
pub fn write_entry(path: &Path, image: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut bytes = Vec::with_capacity(40 + image.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&Sha256::digest(image));
    bytes.extend_from_slice(image);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Where kernel images are cached: `$BLOOMERY_CACHE/kernels` or `~/.cache/bloomery/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .or_else(|| dirs::cache_dir().map(|d| d.join("bloomery")))
        .map(|d| d.join("kernels"))
}

fn check(r: nv::nvrtcResult, what: &str) -> Result<(), CudaError> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError(format!("{what}: {r:?}")))
    }
}

/// Compiles `source` to a CUBIN for `sm_XY`. A compile error carries NVRTC's log.
pub fn compile(source: &str, arch: (i32, i32)) -> Result<Vec<u8>, CudaError> {
    let src = CString::new(source).map_err(|_| CudaError("kernel source holds a NUL".into()))?;
    let name = CString::new("bloomery.cu").unwrap_or_default();
    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC copies the strings it is given; the program is destroyed below.
    unsafe {
        check(
            nv::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ),
            "nvrtcCreateProgram",
        )?;
    }
    let opts: Vec<CString> = [
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
    ]
    .into_iter()
    .filter_map(|o| CString::new(o).ok())
    .collect();
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `prog` is live; the option strings outlive the call.
    let compiled = unsafe { nv::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr()) };
    let result = if compiled == nv::nvrtcResult::NVRTC_SUCCESS {
        cubin(prog)
    } else {
        Err(CudaError(format!(
            "compiling the kernels for sm_{}{}: {compiled:?}\n{}",
            arch.0,
            arch.1,
            log(prog)
        )))
    };
    // SAFETY: destroyed once.
    unsafe { nv::nvrtcDestroyProgram(&mut prog) };
    result
}

fn cubin(prog: nv::nvrtcProgram) -> Result<Vec<u8>, CudaError> {
    let mut size = 0usize;
    // SAFETY: `prog` compiled; the buffer is sized as NVRTC says.
    unsafe {
        check(nv::nvrtcGetCUBINSize(prog, &mut size), "nvrtcGetCUBINSize")?;
        let mut out = vec![0u8; size];
        check(
            nv::nvrtcGetCUBIN(prog, out.as_mut_ptr() as *mut c_char),
            "nvrtcGetCUBIN",
        )?;
        Ok(out)
    }
}

fn log(prog: nv::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: as in `cubin`.
    unsafe {
        if nv::nvrtcGetProgramLogSize(prog, &mut size) != nv::nvrtcResult::NVRTC_SUCCESS {
            return String::new();
        }
        let mut buf = vec![0u8; size.max(1)];
        if nv::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char)
            != nv::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        CStr::from_bytes_until_nul(&buf)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// The kernel image for `arch`: from the cache when an entry verifies, else compiled (and
/// cached when a cache folder is usable). `fresh` skips the cache read (after the driver
/// refused a cached image).
pub fn image(arch: (i32, i32), driver: i32, fresh: bool) -> Result<Vec<u8>, CudaError> {
    let source = program();
    let key = cache_key(&source, arch, driver, nvrtc_version()?);
    let path = cache_dir().map(|d| d.join(key));
    if let (Some(p), false) = (&path, fresh) {
        if let Some(image) = read_entry(p) {
            return Ok(image);
        }
    }
    let t = std::time::Instant::now();
    let image = compile(&source, arch)?;
    log::info!(
        "compiled the CUDA kernels for sm_{}{} in {:.2} s",
        arch.0,
        arch.1,
        t.elapsed().as_secs_f64()
    );
    if let Some(p) = &path {
        if let Err(e) = write_entry(p, &image) {
            log::warn!("could not cache the kernels at {}: {e}", p.display());
        }
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_changes_with_every_input() {
        let k = cache_key("a", (9, 0), 13000, (13, 0));
        assert_ne!(k, cache_key("b", (9, 0), 13000, (13, 0)));
        assert_ne!(k, cache_key("a", (8, 6), 13000, (13, 0)));
        assert_ne!(k, cache_key("a", (9, 0), 12080, (13, 0)));
        assert_ne!(k, cache_key("a", (9, 0), 13000, (12, 9)));
        assert_eq!(k, cache_key("a", (9, 0), 13000, (13, 0)));
        assert!(k.starts_with("kernels-sm90-"));
    }

    #[test]
    fn cache_entries_verify_or_are_refused() {
        let dir = std::env::temp_dir().join(format!("bloomery-kcache-{}", std::process::id()));
        let p = dir.join("k.cubin");
        write_entry(&p, b"\x7fELF image").unwrap();
        assert_eq!(read_entry(&p).as_deref(), Some(&b"\x7fELF image"[..]));
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(read_entry(&p), None, "a flipped bit must not be trusted");
        std::fs::write(&p, &bytes[..20]).unwrap();
        assert_eq!(
            read_entry(&p),
            None,
            "a truncated entry must not be trusted"
        );
        std::fs::write(&p, b"").unwrap();
        assert_eq!(read_entry(&p), None);
        assert_eq!(read_entry(&dir.join("absent")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The kernels must compile for every architecture we serve. scripts/test.sh installs NVRTC
    /// from PyPI and sets BLOOMERY_REQUIRE_NVRTC, so there a missing library fails; a bare
    /// `cargo test` without it says why and skips.
    #[test]
    fn kernels_compile_for_served_architectures() {
        if !nvrtc_present() {
            assert!(
                std::env::var_os("BLOOMERY_REQUIRE_NVRTC").is_none(),
                "BLOOMERY_REQUIRE_NVRTC is set but libnvrtc does not load (LD_LIBRARY_PATH?)"
            );
            eprintln!("skipped: libnvrtc is not loadable (set LD_LIBRARY_PATH to its folder)");
            return;
        }
        for arch in [(8, 6), (8, 9), (9, 0)] {
            let image = compile(&program(), arch).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                &image[..4],
                b"\x7fELF",
                "sm_{}{}: not a CUBIN",
                arch.0,
                arch.1
            );
        }
    }
}
