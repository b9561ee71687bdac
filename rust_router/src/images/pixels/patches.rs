//! SigLIP 2 NaFlex: the patch-budget size and the fixed-size block of patches, laid out as
//! trt_tei_runtime/image_patches.py lays them out (its docstring describes the block).

/// (height, width), multiples of `patch`, of the largest scale of the image whose grid
/// holds at most `max_num_patches` patches: the runtime's bisection, step for step.
pub fn size_for_patch_budget(
    height: usize,
    width: usize,
    patch: usize,
    max_num_patches: usize,
) -> (usize, usize) {
    const EPS: f64 = 1e-5;
    let patch_f = patch as f64;
    let scaled = |scale: f64, size: usize| -> usize {
        patch.max(((size as f64 * scale / patch_f).ceil() as usize) * patch)
    };
    let (mut low, mut high) = (EPS / 10.0, 100.0);
    while high - low >= EPS {
        let scale = (low + high) / 2.0;
        let patches =
            (scaled(scale, height) as f64 / patch_f) * (scaled(scale, width) as f64 / patch_f);
        if patches <= max_num_patches as f64 {
            low = scale;
        } else {
            high = scale;
        }
    }
    (scaled(low, height), scaled(low, width))
}

/// Interleaved `[height, width, 3]` values as the block `[1, max_num_patches + 1,
/// 3 * patch * patch]`: the patches row-major, zero rows, then the grid's size.
pub fn patch_block(
    values: &[f32],
    height: usize,
    width: usize,
    patch: usize,
    max_num_patches: usize,
) -> Vec<f32> {
    let (rows, cols) = (height / patch, width / patch);
    let row_len = 3 * patch * patch;
    let mut block = vec![0f32; (max_num_patches + 1) * row_len];
    for (index, out) in block
        .chunks_exact_mut(row_len)
        .take(rows * cols)
        .enumerate()
    {
        let (grid_y, grid_x) = (index / cols, index % cols);
        for (dy, line) in out.chunks_exact_mut(3 * patch).enumerate() {
            let start = ((grid_y * patch + dy) * width + grid_x * patch) * 3;
            line.copy_from_slice(&values[start..start + 3 * patch]);
        }
    }
    let last = max_num_patches * row_len;
    block[last] = rows as f32;
    block[last + 1] = cols as f32;
    block
}
