//! The per-work-item decode kernel: one request, one KV head, one contiguous range
//! of key positions, all query heads of that KV head's GQA group at once (so every
//! K and V row is read from memory once per group), with an online softmax.

use crate::simd::{Isa, Portable, Simd};

/// Keys scored per online-softmax step; scores live on the stack as `[group, CHUNK]`.
const CHUNK: usize = 16;
/// Largest GQA group the stack scratch holds (also the declared `max_gqa_ratio`).
pub const MAX_GROUP: usize = 64;

/// Read-only inputs of one work item.
pub struct ItemArgs<'a> {
    /// The group's `group * head_dim` query values (contiguous in the token row).
    pub q: &'a [f32],
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    /// The request's physical blocks.
    pub blocks: &'a [u32],
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub kv_head: usize,
    pub head_dim: usize,
    pub group: usize,
    pub scale: f32,
    /// Key positions `start..end` of the request.
    pub start: usize,
    pub end: usize,
}

/// Writes the normalised partial output `[group, head_dim]` and its LSE `[group]`.
pub fn attend(isa: Isa, a: &ItemArgs<'_>, o: &mut [f32], lse: &mut [f32]) {
    debug_assert!(a.group <= MAX_GROUP && a.head_dim % 16 == 0);
    debug_assert!(o.len() == a.group * a.head_dim && lse.len() == a.group);
    // SAFETY: `isa` came from `Isa::detect`, so the target features are present;
    // the caller validated every block id and buffer length.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => attend_avx512(a, o, lse),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => attend_avx2(a, o, lse),
            _ => attend_generic::<Portable>(a, o, lse),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn attend_avx512(a: &ItemArgs<'_>, o: &mut [f32], lse: &mut [f32]) {
    attend_generic::<crate::simd::Avx512>(a, o, lse)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(a: &ItemArgs<'_>, o: &mut [f32], lse: &mut [f32]) {
    attend_generic::<crate::simd::Avx2>(a, o, lse)
}

#[inline(always)]
unsafe fn attend_generic<S: Simd>(a: &ItemArgs<'_>, o: &mut [f32], lse: &mut [f32]) {
    let (g_n, hd, bs) = (a.group, a.head_dim, a.block_size);
    let row_stride = a.num_kv_heads * hd;
    let head_off = a.kv_head * hd;
    let mut m = [f32::NEG_INFINITY; MAX_GROUP];
    let mut l = [0f32; MAX_GROUP];
    let mut s = [0f32; MAX_GROUP * CHUNK];
    let mut kv_off = [0usize; CHUNK];
    o.fill(0.0);
    let qp = a.q.as_ptr();
    let kp = a.k_cache.as_ptr();
    let vp = a.v_cache.as_ptr();
    let op = o.as_mut_ptr();

    let mut pos = a.start;
    while pos < a.end {
        let n = CHUNK.min(a.end - pos);
        for (j, off) in kv_off.iter_mut().enumerate().take(n) {
            let p = pos + j;
            let slot = *a.blocks.get_unchecked(p / bs) as usize * bs + p % bs;
            *off = slot * row_stride + head_off;
        }
        // Scores of every head of the group against each key; K row loaded once.
        for j in 0..n {
            let k = kp.add(kv_off[j]);
            for g in 0..g_n {
                s[g * CHUNK + j] = S::dot(qp.add(g * hd), k, hd) * a.scale;
            }
        }
        // Online softmax: rescale the running sums to the new maximum.
        for g in 0..g_n {
            let row = &mut s[g * CHUNK..g * CHUNK + n];
            let cm = row.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
            let m_new = m[g].max(cm);
            if m_new > m[g] {
                let corr = (m[g] - m_new).exp();
                l[g] *= corr;
                S::scale(op.add(g * hd), corr, hd);
                m[g] = m_new;
            }
            let mut sum = 0.0;
            for x in row.iter_mut() {
                *x = (*x - m_new).exp();
                sum += *x;
            }
            l[g] += sum;
        }
        // Weighted V rows, each loaded once for the whole group.
        for j in 0..n {
            let v = vp.add(kv_off[j]);
            for g in 0..g_n {
                S::axpy(op.add(g * hd), s[g * CHUNK + j], v, hd);
            }
        }
        pos += n;
    }
    for g in 0..g_n {
        if l[g] > 0.0 {
            S::scale(op.add(g * hd), 1.0 / l[g], hd);
            lse[g] = m[g] + l[g].ln();
        } else {
            lse[g] = f32::NEG_INFINITY;
        }
    }
}
