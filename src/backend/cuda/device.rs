//! The card through the driver API loaded at run time: discovery, one context per model with a
//! main stream (kernels, products) and a side stream (copies that overlap them), events between
//! the two, page-locked host ranges, raw device buffers, kernel launches and cuBLAS products. With no driver library the
//! functions here say so instead of failing, so the same binary serves on the CPU.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};

#[derive(Debug, Clone, PartialEq)]
pub struct CudaError(pub String);

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CudaError {}

pub(crate) fn err(what: &str, e: impl fmt::Debug) -> CudaError {
    CudaError(format!("{what}: {e:?}"))
}

/// One card as `--list-devices` and the planner see it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    /// llama.cpp's device name: `CUDA0`, `CUDA1`, ...
    pub name: String,
    /// The card's own name (`NVIDIA H200`).
    pub description: String,
    pub free_bytes: usize,
    pub total_bytes: usize,
    pub compute_capability: (i32, i32),
}

/// Whether the driver library can be loaded at all (no card, no driver: false, never a panic).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// The cards the driver reports, with their free memory; empty when there is no driver.
pub fn list() -> Result<Vec<DeviceInfo>, CudaError> {
    if !driver_present() {
        return Ok(Vec::new());
    }
    result::init().map_err(|e| err("initialising the CUDA driver", e))?;
    let n = CudaContext::device_count().map_err(|e| err("counting CUDA devices", e))?;
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        let ctx = CudaContext::new(i).map_err(|e| err(&format!("opening CUDA{i}"), e))?;
        let (free, total) = ctx
            .mem_get_info()
            .map_err(|e| err(&format!("reading CUDA{i} memory"), e))?;
        out.push(DeviceInfo {
            ordinal: i,
            name: format!("CUDA{i}"),
            description: ctx.name().unwrap_or_else(|_| "unknown".into()),
            free_bytes: free,
            total_bytes: total,
            compute_capability: ctx
                .compute_capability()
                .map_err(|e| err(&format!("reading CUDA{i} compute capability"), e))?,
        });
    }
    Ok(out)
}

/// `--list-devices` as llama-server prints it: `  CUDA0: NVIDIA H200 (143155 MiB, 142629 MiB free)`.
pub fn list_text(cards: &[DeviceInfo]) -> String {
    let mut s = String::from("Available devices:\n");
    if cards.is_empty() {
        s.push_str("  (none)\n");
    }
    for c in cards {
        s.push_str(&format!(
            "  {}: {} ({} MiB, {} MiB free)\n",
            c.name,
            c.description,
            c.total_bytes >> 20,
            c.free_bytes >> 20
        ));
    }
    s
}

/// The driver's CUDA version as `major * 1000 + minor * 10` (13000 for 13.0).
pub fn driver_version() -> Result<i32, CudaError> {
    let mut v = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| err("reading the driver version", e))?;
    Ok(v)
}

/// A device allocation owned by Rust; freed on drop.
pub struct DevBuf {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DevBuf {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.bytes);
        self.ptr + offset as u64
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.bytes > 0 {
            // SAFETY: allocated by `Gpu::alloc` and freed once, here.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

// SAFETY: a device address; the context it belongs to is shared by every thread that uses it.
unsafe impl Send for DevBuf {}

/// One argument of a kernel launch: every kernel takes device addresses, ints and floats.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// A card with the context, streams, kernels and cuBLAS handle a model runs on.
pub struct Gpu {
    pub info: DeviceInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Host-to-card copies that run beside the main stream's work (expert streaming).
    side: Arc<CudaStream>,
    module: Option<Arc<CudaModule>>,
    blas: blas_sys::cublasHandle_t,
    /// Kernels launch with programmatic dependent launch (see [`pdl_wanted`]).
    pdl: bool,
}

/// Whether kernels on a card of compute capability `cc` launch so that the next kernel on the
/// stream may be scheduled while the one before it finishes (programmatic dependent launch,
/// sm_90 and newer). Every kernel waits for the grids before it (`grid_sync` in
/// kernels/common.cuh) before it touches memory they write or read, so the overlap is only the
/// launch itself and the weight prefetches placed before that wait. Opt-in (`BLOOMERY_PDL=1`)
/// until it has been measured on a lent card (docs/GPU-NOTES.md, the plan after session 27).
pub fn pdl_wanted(cc: (i32, i32), env: Option<&str>) -> bool {
    cc.0 >= 9 && env.is_some_and(|v| v.trim() == "1")
}

// SAFETY: the handle and stream are used from one thread at a time (the engine is behind the
// scheduler's single owner); cuBLAS handles may move between threads.
unsafe impl Send for Gpu {}

impl Gpu {
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        let devices = list()?;
        let info = devices
            .get(ordinal)
            .cloned()
            .ok_or_else(|| CudaError(format!("no CUDA{ordinal}: {} cards", devices.len())))?;
        let ctx = CudaContext::new(ordinal).map_err(|e| err("creating a context", e))?;
        // SAFETY: one stream does all the work, so the safe layer's cross-stream events are
        // not needed; raw launches below do not use them either.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| err("creating a stream", e))?;
        let side = ctx.new_stream().map_err(|e| err("creating a stream", e))?;
        let handle = blas::create_handle().map_err(|e| err("creating a cuBLAS handle", e))?;
        // SAFETY: the handle was just created; the stream lives as long as `Gpu`.
        unsafe { blas::set_stream(handle, stream.cu_stream() as _) }
            .map_err(|e| err("binding cuBLAS to the stream", e))?;
        let pdl = pdl_wanted(
            info.compute_capability,
            std::env::var("BLOOMERY_PDL").ok().as_deref(),
        );
        Ok(Gpu {
            info,
            pdl,
            ctx,
            stream,
            side,
            module: None,
            blas: handle,
        })
    }

    /// Loads the compiled kernels (a CUBIN image).
    pub fn load_kernels(&mut self, image: Vec<u8>) -> Result<(), CudaError> {
        let m = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(image))
            .map_err(|e| err("loading the kernel image", e))?;
        self.module = Some(m);
        Ok(())
    }

    pub fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
        self.module
            .as_ref()
            .ok_or_else(|| CudaError("kernels are not loaded".into()))?
            .load_function(name)
            .map_err(|e| err(&format!("finding kernel {name}"), e))
    }

    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, CudaError> {
        if bytes == 0 {
            return Ok(DevBuf { ptr: 0, bytes: 0 });
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| err("binding the context", e))?;
        // SAFETY: a plain allocation, freed by DevBuf's drop.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            err(
                &format!("allocating {} MiB on {}", bytes >> 20, self.info.name),
                e,
            )
        })?;
        Ok(DevBuf { ptr, bytes })
    }

    /// Copies `src` to the device at `dst` (asynchronous on the stream; `src` must stay alive
    /// until the next `sync`).
    pub fn upload<T: Copy>(&self, dst: u64, src: &[T]) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller sized `dst` for `src`.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| err("copying to the card", e))
    }

    /// Copies from the device into `dst` and waits for it.
    pub fn download<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<(), CudaError> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller sized `src` for `dst`; the sync below completes the copy before
        // `dst` is read.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| err("copying from the card", e))?;
        self.sync()
    }

    pub fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were sized by the caller.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(|e| err("copying on the card", e))
    }

    pub fn sync(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(|e| err("waiting for the card", e))
    }

    /// Copies `src` to the card at `dst` on the side stream. `src` must stay mapped and unchanged
    /// until an event recorded after the copy has passed; the copy overlaps the main stream's
    /// work only when `src` is page-locked ([`Gpu::pin`]), else the call returns after the
    /// driver staged it.
    pub fn upload_side(&self, dst: u64, src: &[u8]) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller sized `dst` for `src` and keeps `src` alive as documented.
        unsafe { result::memcpy_htod_async(dst, src, self.side.cu_stream()) }
            .map_err(|e| err("streaming to the card", e))
    }

    /// A card-to-card copy on the side stream.
    pub fn copy_side(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were sized by the caller.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.side.cu_stream()) }
            .map_err(|e| err("copying on the card", e))
    }

    /// The work queued on the main stream so far, as an event the side stream can wait for.
    pub fn main_event(&self) -> Result<Event, CudaError> {
        self.stream
            .record_event(None)
            .map(Event)
            .map_err(|e| err("recording an event", e))
    }

    /// The copies queued on the side stream so far, as an event the main stream can wait for.
    pub fn side_event(&self) -> Result<Event, CudaError> {
        self.side
            .record_event(None)
            .map(Event)
            .map_err(|e| err("recording an event", e))
    }

    /// [`Gpu::main_event`] with a timestamp, for [`Event::elapsed_us`].
    pub fn timed_main_event(&self) -> Result<Event, CudaError> {
        self.stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map(Event)
            .map_err(|e| err("recording an event", e))
    }

    /// [`Gpu::side_event`] with a timestamp, for [`Event::elapsed_us`].
    pub fn timed_side_event(&self) -> Result<Event, CudaError> {
        self.side
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map(Event)
            .map_err(|e| err("recording an event", e))
    }

    /// Work queued on the main stream from now on starts after `e`.
    pub fn main_waits(&self, e: &Event) -> Result<(), CudaError> {
        self.stream
            .wait(&e.0)
            .map_err(|e| err("waiting for an event", e))
    }

    /// Copies queued on the side stream from now on start after `e`.
    pub fn side_waits(&self, e: &Event) -> Result<(), CudaError> {
        self.side
            .wait(&e.0)
            .map_err(|e| err("waiting for an event", e))
    }

    /// Page-locks `range` (host memory, typically a read-only file map) so copies from it run
    /// on the copy engine at the bus's speed; unlocked when the [`Pinned`] drops. The range must
    /// not overlap one pinned before.
    pub fn pin(&self, range: &[u8]) -> Result<Pinned, CudaError> {
        self.bind()?;
        let ptr = range.as_ptr() as *mut c_void;
        let mut last = None;
        // a read-only map can only be locked as read-only; plain memory either way
        for flags in [sys::CU_MEMHOSTREGISTER_READ_ONLY, 0] {
            // SAFETY: `range` is mapped for its whole length; unregistered by `Pinned`'s drop.
            match unsafe { sys::cuMemHostRegister_v2(ptr, range.len(), flags) }.result() {
                Ok(()) => {
                    return Ok(Pinned {
                        ptr,
                        ctx: self.ctx.clone(),
                    })
                }
                Err(e) => last = Some(e),
            }
        }
        Err(err(
            &format!("page-locking {} MiB of host memory", range.len() >> 20),
            last,
        ))
    }

    pub fn launch(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let mut vals: Vec<[u8; 8]> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p.to_ne_bytes(),
                Arg::I64(v) => v.to_ne_bytes(),
                Arg::I32(v) => {
                    let mut b = [0; 8];
                    b[..4].copy_from_slice(&v.to_ne_bytes());
                    b
                }
                Arg::F32(v) => {
                    let mut b = [0; 8];
                    b[..4].copy_from_slice(&v.to_ne_bytes());
                    b
                }
            })
            .collect();
        let mut params: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        if self.pdl {
            // SAFETY: a zeroed attribute is a valid value of the plain-data union; only the
            // field the id names is read.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: shared,
                hStream: self.stream.cu_stream(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below; `cfg` and `attr` outlive the call.
            return unsafe {
                sys::cuLaunchKernelEx(
                    &cfg,
                    f.cu_function(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .result()
            .map_err(|e| err("launching a kernel", e));
        }
        // SAFETY: `params` point at values laid out as the kernel's parameters (8-byte pointers
        // and 64-bit ints, 4-byte ints and floats at the start of their slot).
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                grid,
                (block, 1, 1),
                shared,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| err("launching a kernel", e))
    }

    /// Makes this card's context current on the calling thread (the engine may be loaded on
    /// one thread and stepped on another).
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| err("binding the context", e))
    }

    /// A matrix product through cuBLAS; see [`Gemm`].
    pub fn gemm(&self, g: &Gemm) -> Result<(), CudaError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ty = if g.half {
            blas_sys::cudaDataType::CUDA_R_16F
        } else {
            blas_sys::cudaDataType::CUDA_R_32F
        };
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // SAFETY: pointers were sized by the caller for the shapes and strides given.
        unsafe {
            blas::gemm_strided_batched_ex(
                self.blas,
                op(g.trans_a),
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                g.m as i32,
                g.n as i32,
                g.k as i32,
                &alpha as *const f32 as *const c_void,
                g.a as *const c_void,
                ty,
                g.lda as i32,
                g.stride_a as i64,
                g.b as *const c_void,
                ty,
                g.ldb as i32,
                g.stride_b as i64,
                &beta as *const f32 as *const c_void,
                g.c as *mut c_void,
                blas_sys::cudaDataType::CUDA_R_32F,
                g.ldc as i32,
                g.stride_c as i64,
                g.batch as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| err("cuBLAS GemmStridedBatchedEx", e))
    }

    /// From here until [`Gpu::end_capture`], launches on the stream are recorded into a graph
    /// instead of running.
    pub fn begin_capture(&self) -> Result<(), CudaError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| err("starting a graph capture", e))
    }

    pub fn end_capture(&self) -> Result<Graph, CudaError> {
        match self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| err("ending a graph capture", e))?
        {
            Some(g) => Ok(Graph(g)),
            None => Err(CudaError("the graph capture recorded nothing".into())),
        }
    }
}

/// The shape of one (strided, batched) product `C = op(A) B` in cuBLAS's column-major terms:
/// `op(A)` is `m x k` (`A` stored `k x m` when `trans_a`), `B` is `k x n`, `C` is `m x n` f32;
/// `A` and `B` are f16 when `half`, else f32. `batch` products step each pointer by its stride
/// (in elements).
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub half: bool,
    pub trans_a: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: u64,
    pub lda: usize,
    pub stride_a: usize,
    pub b: u64,
    pub ldb: usize,
    pub stride_b: usize,
    pub c: u64,
    pub ldc: usize,
    pub stride_c: usize,
    pub batch: usize,
}

impl Gemm {
    /// `y[n][m] = W x` for a row-major weight `a` (`m` rows of `k`) and `n` row-major inputs.
    pub fn weights(half: bool, m: usize, n: usize, k: usize, a: u64, b: u64, c: u64) -> Gemm {
        Gemm {
            half,
            trans_a: true,
            m,
            n,
            k,
            a,
            lda: k,
            stride_a: 0,
            b,
            ldb: k,
            stride_b: 0,
            c,
            ldc: m,
            stride_c: 0,
            batch: 1,
        }
    }
}

/// A point in one of a card's streams (see [`Gpu::main_event`]).
pub struct Event(cudarc::driver::CudaEvent);

impl Event {
    /// Whether the work queued before the event has finished; never waits.
    pub fn done(&self) -> Result<bool, CudaError> {
        self.0
            .try_is_complete()
            .map_err(|e| err("asking whether copies have finished", e))
    }

    /// Microseconds from this event to `end`, both timed (`Gpu::timed_*_event`); waits for
    /// both.
    pub fn elapsed_us(&self, end: &Event) -> Result<f64, CudaError> {
        self.0
            .elapsed_ms(&end.0)
            .map(|ms| ms as f64 * 1e3)
            .map_err(|e| err("timing events", e))
    }
}

// SAFETY: an event handle of the context the engine binds on whichever thread steps it.
unsafe impl Send for Event {}

/// A page-locked host range; unlocked on drop.
pub struct Pinned {
    ptr: *mut c_void,
    ctx: Arc<CudaContext>,
}

// SAFETY: the address of a mapping that outlives this value; unregistering is thread-safe.
unsafe impl Send for Pinned {}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: registered by `Gpu::pin`, unregistered once, here.
        let _ = unsafe { sys::cuMemHostUnregister(self.ptr) };
    }
}

/// Byte ranges `(start, end)` grown to whole pages of `page` bytes and merged where they touch,
/// so each page is locked once (the driver refuses a page registered twice).
pub fn page_spans(ranges: &[(usize, usize)], page: usize) -> Vec<(usize, usize)> {
    let mut spans: Vec<(usize, usize)> = ranges
        .iter()
        .filter(|r| r.1 > r.0)
        .map(|&(a, b)| (a / page * page, b.div_ceil(page) * page))
        .collect();
    spans.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// A captured sequence of launches, replayed with one call.
pub struct Graph(cudarc::driver::CudaGraph);

// SAFETY: replayed only by the owner of the `Gpu` whose stream it was captured on.
unsafe impl Send for Graph {}

impl Graph {
    pub fn launch(&self) -> Result<(), CudaError> {
        self.0.launch().map_err(|e| err("replaying a graph", e))
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: created in `open`, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.blas) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependent_launch_only_when_asked_and_on_hopper_or_newer() {
        assert!(!pdl_wanted((8, 6), None));
        assert!(!pdl_wanted((8, 9), Some("1")));
        assert!(!pdl_wanted((9, 0), None));
        assert!(pdl_wanted((9, 0), Some("1")));
        assert!(pdl_wanted((10, 0), Some(" 1 ")));
        assert!(!pdl_wanted((9, 0), Some("0")));
        assert!(!pdl_wanted((12, 0), Some("yes")));
    }

    #[test]
    fn pinned_ranges_cover_whole_pages_once() {
        // two tensors sharing a page, one apart, one empty
        let r = [(5000, 9000), (9000, 12289), (40960, 41000), (50000, 50000)];
        assert_eq!(
            page_spans(&r, 4096),
            vec![(4096, 16384), (40960, 45056)],
            "the shared page is locked once"
        );
        assert_eq!(page_spans(&[(8192, 12288)], 4096), vec![(8192, 12288)]);
        assert!(page_spans(&[], 4096).is_empty());
    }

    #[test]
    fn devices_are_listed_as_llama_server_lists_them() {
        assert_eq!(list_text(&[]), "Available devices:\n  (none)\n");
        let card = DeviceInfo {
            ordinal: 0,
            name: "CUDA0".into(),
            description: "NVIDIA H200".into(),
            free_bytes: 142_629 << 20,
            total_bytes: 143_155 << 20,
            compute_capability: (9, 0),
        };
        assert_eq!(
            list_text(&[card]),
            "Available devices:\n  CUDA0: NVIDIA H200 (143155 MiB, 142629 MiB free)\n"
        );
    }
}
