//! The model ops' device path on `emu`: what the driver refuses, the step buffer's
//! fixed address under a graph, the shared conversion.

use super::*;
use pagoda_core::{open_device, HostSlice, Shape, Storage};

fn rt() -> Arc<dyn DeviceRuntime> {
    open_device(Device::Emu).unwrap()
}

fn f32_buf(rt: &Arc<dyn DeviceRuntime>, dims: &[usize], data: Option<&[f32]>) -> Storage {
    let mut s = rt
        .alloc_zeroed(DType::F32, Shape::new(dims).unwrap())
        .unwrap();
    if let Some(d) = data {
        rt.upload(s.view_mut(), HostSlice::F32(d)).unwrap();
    }
    s
}

fn step<'a>(ids: &'a [u32], positions: &'a [u32], slots: &'a [i64]) -> StepInputs<'a> {
    StepInputs {
        input_ids: ids,
        positions,
        slot_mapping: slots,
        logits_rows: &[],
    }
}

/// As cuBLAS, which initialises each new problem size on first use: a GEMM shape
/// first met inside a capture is refused, one run eagerly before is recorded.
#[test]
fn a_gemm_shape_first_met_in_a_capture_is_refused() {
    let rt = rt();
    let mut ops = emu_ops(rt.clone()).unwrap();
    ops.reserve_step(4, 4).unwrap();
    let w = f32_buf(&rt, &[3, 8], None);
    let (x2, x4) = (f32_buf(&rt, &[2, 8], None), f32_buf(&rt, &[4, 8], None));
    let (mut o2, mut o4) = (f32_buf(&rt, &[2, 3], None), f32_buf(&rt, &[4, 3], None));
    ops.linear(x2.view(), w.view(), o2.view_mut()).unwrap();
    ops.begin_capture().unwrap();
    let seen = ops.linear(x2.view(), w.view(), o2.view_mut());
    let new = ops.linear(x4.view(), w.view(), o4.view_mut());
    ops.abort_capture();
    seen.unwrap();
    let e = new.unwrap_err().to_string();
    assert!(e.contains("first met inside a capture"), "{e}");
    // Warmed up eagerly, the same shape captures.
    ops.linear(x4.view(), w.view(), o4.view_mut()).unwrap();
    ops.begin_capture().unwrap();
    let warmed = ops.linear(x4.view(), w.view(), o4.view_mut());
    ops.abort_capture();
    warmed.unwrap();
}

#[test]
fn the_step_conversion_pads_slots_and_refuses_what_does_not_fit() {
    let mut out = Vec::new();
    let s = StepInputs {
        input_ids: &[5, 6],
        positions: &[0, 1],
        slot_mapping: &[-7, 9],
        logits_rows: &[1],
    };
    pack_step(&s, &mut out).unwrap();
    assert_eq!(out, [5, 6, 0, 1, -1, 9, 1]);
    let big_slot = step(&[1], &[0], &[1 << 31]);
    assert!(pack_step(&big_slot, &mut out).is_err());
    let big_id = step(&[u32::MAX], &[0], &[0]);
    assert!(pack_step(&big_id, &mut out).is_err());
    assert!(pack_step(&step(&[1, 2], &[0], &[0, 1]), &mut out).is_err());
    // And through the ops: the step is refused before anything reaches the device.
    let mut ops = emu_ops(rt()).unwrap();
    let e = ops.begin_step(&big_slot).unwrap_err().to_string();
    assert!(e.contains("slot"), "{e}");
}

/// An embedding captured once reads the step's ids at the step buffer's address: a
/// replay after the next `begin_step` embeds the new ids; a step larger than reserved
/// is refused (the buffer would move).
#[test]
fn a_replay_reads_the_next_steps_inputs_from_the_fixed_step_buffer() {
    let rt = rt();
    let mut ops = emu_ops(rt.clone()).unwrap();
    let table: Vec<f32> = (0..4 * 8).map(|i| i as f32).collect();
    let table = f32_buf(&rt, &[4, 8], Some(&table));
    let mut out = f32_buf(&rt, &[2, 8], None);
    ops.reserve_step(2, 2).unwrap();
    ops.begin_step(&step(&[2, 0], &[0, 0], &[-1, -1])).unwrap();
    ops.embed(table.view(), 1.0, out.view_mut()).unwrap();
    ops.begin_capture().unwrap();
    ops.embed(table.view(), 1.0, out.view_mut()).unwrap();
    let g = ops.end_capture().unwrap();
    ops.begin_step(&step(&[1, 3], &[0, 0], &[-1, -1])).unwrap();
    // SAFETY: the table and out are alive at their captured addresses; ids < 4.
    unsafe { ops.replay(g) }.unwrap();
    let mut host = vec![0.0; 16];
    ops.download_f32(out.view(), &mut host).unwrap();
    let want: Vec<f32> = (8..16).chain(24..32).map(|i| i as f32).collect();
    assert_eq!(host, want);
    let e = ops.begin_step(&step(&[1, 2, 3], &[0; 3], &[-1; 3]));
    assert!(e.unwrap_err().to_string().contains("reserved"));
}

/// A capture cannot wait on the host or allocate: the two ops that return host
/// values are refused inside one, by the driver, as a GPU's stream capture would.
#[test]
fn a_capture_refuses_host_waits_and_allocations_through_the_driver() {
    let rt = rt();
    let mut ops = emu_ops(rt.clone()).unwrap();
    ops.reserve_step(2, 2).unwrap();
    let logits = f32_buf(
        &rt,
        &[2, 5],
        Some(&[0., 1., 9., 2., 3., 7., 1., 0., 0., 0.]),
    );
    ops.begin_capture().unwrap();
    let mut host = vec![0.0; 10];
    let down = ops.download_f32(logits.view(), &mut host);
    let mut ids = [0u32; 2];
    // The argmax buffers are not allocated yet: the allocation is what is refused.
    let argmax = ops.argmax(logits.view(), &mut ids);
    ops.abort_capture();
    let down = down.unwrap_err().to_string();
    assert!(down.contains("capture"), "{down}");
    let argmax = argmax.unwrap_err().to_string();
    assert!(
        argmax.contains("allocation during a CUDA graph capture"),
        "{argmax}"
    );
    ops.argmax(logits.view(), &mut ids).unwrap();
    assert_eq!(ids, [2, 0]);
    // Allocated now, the argmax is still refused inside a capture: it waits.
    ops.begin_capture().unwrap();
    let again = ops.argmax(logits.view(), &mut ids);
    ops.abort_capture();
    assert!(again.unwrap_err().to_string().contains("capture"));
}

#[test]
fn views_of_another_device_are_refused() {
    let cpu = open_device(Device::Cpu).unwrap();
    let mut ops = emu_ops(rt()).unwrap();
    ops.begin_step(&step(&[0], &[0], &[-1])).unwrap();
    let table = f32_buf(&cpu, &[4, 8], None);
    let mut out = f32_buf(&rt(), &[1, 8], None);
    let e = ops.embed(table.view(), 1.0, out.view_mut()).unwrap_err();
    assert!(matches!(e, CoreError::DeviceMismatch { .. }), "{e}");
}
