//! TEMPORARY placeholder (not committed): the gemm helper's branch brings the real one.
use pagoda_cuda_kernels::Element;
#[derive(Debug, thiserror::Error)]
#[error("gemm: {0}")]
pub struct GemmError(String);
fn f<T: Element>(x: T) -> f32 {
    match T::DTYPE {
        pagoda_cuda_kernels::Dtype::F32 => unsafe { std::mem::transmute_copy::<T, f32>(&x) },
        pagoda_cuda_kernels::Dtype::Bf16 => {
            unsafe { std::mem::transmute_copy::<T, half::bf16>(&x) }.to_f32()
        }
        pagoda_cuda_kernels::Dtype::F16 => {
            unsafe { std::mem::transmute_copy::<T, half::f16>(&x) }.to_f32()
        }
    }
}
fn t<O: Element>(x: f32) -> O {
    match O::DTYPE {
        pagoda_cuda_kernels::Dtype::F32 => unsafe { std::mem::transmute_copy::<f32, O>(&x) },
        pagoda_cuda_kernels::Dtype::Bf16 => unsafe {
            std::mem::transmute_copy::<half::bf16, O>(&half::bf16::from_f32(x))
        },
        pagoda_cuda_kernels::Dtype::F16 => unsafe {
            std::mem::transmute_copy::<half::f16, O>(&half::f16::from_f32(x))
        },
    }
}
pub fn gemm_host<X: Element, W: Element, O: Element>(
    x: &[X],
    w: &[W],
    out: &mut [O],
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), GemmError> {
    if x.len() != m * k || w.len() != n * k || out.len() != m * n {
        return Err(GemmError("len".into()));
    }
    let xf: Vec<f32> = x.iter().map(|&v| f(v)).collect();
    let wf: Vec<f32> = w.iter().map(|&v| f(v)).collect();
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for (a, b) in xf[i * k..(i + 1) * k].iter().zip(&wf[j * k..(j + 1) * k]) {
                acc += a * b;
            }
            out[i * n + j] = t(acc);
        }
    }
    Ok(())
}
