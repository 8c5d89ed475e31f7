#pragma once
/// The Winograd convolution template: renders, for one ISA and one fully static 3x3, stride-1,
/// undilated, ungrouped problem, the source of
///
///   Y[N, M, OH, OW] = epilogue(conv3x3(X[N, C, H, W], W[M, C, 3, 3]) + bias[M])
///
/// with Winograd's minimal filtering F(4x4, 3x3) or F(2x2, 3x3) (Lavin and Gray, "Fast Algorithms
/// for Convolutional Neural Networks", 2015). Below for F(4x4, 3x3): the output is cut into 4x4
/// tiles; each tile needs a 6x6 input patch d. With the constant matrices B (6x6), G (6x3) and A
/// (6x4),
///
///   Y_tile = A^T [ sum_c (G g[m, c] G^T) .* (B^T d[c] B) ] A
///
/// so the 36 elementwise products of a tile, summed over input channels, are 36 independent
/// matrix products [tiles x C] @ [C x M]: 36 multiply-adds per tile and channel pair instead of
/// the direct convolution's 144 (4x fewer), for a transform of each input patch and each output
/// tile. F(2x2, 3x3) (tile 2: 4x4 patches, B 4x4, G 4x3, A 4x2) does 16 per 2x2 tile and channel
/// pair against 36 (2.25x fewer), with transformed weights 16/9 of W instead of 4x: where the
/// output has few 4x4 tiles (7 x 7: 4, a third of them padding) and the weights are large, the
/// smaller form reads less memory. It runs in three passes:
///
///   1. input transform: V[36][C][T] (T tiles, padded to the register block), one task per
///      (image, channel, row of tiles): the 6 input rows of the tile row (zeros outside the image)
///      are combined by B^T down the columns in one vectorized pass, then by B along each tile;
///   2. the 36 products Mt[36][T][M] = V^T @ U, tiles by output channels in register blocks
///      (R tiles x two vectors of channels), one task per (product, channel block, tile block);
///      the tile blocks of a channel block each prefetch a share of the next block's strip of U
///      into L2;
///   3. output transform: per tile, A^T and A applied to vectors of output channels, then the
///      bias and the epilogue as each output is stored.
///
/// On channels-last activations (problem.channels_last: X [N, H, W, C], Y [N, OH, OW, M], the
/// choice "winograd-nhwc") the same passes run on the other axis: pass 1 transforms a vector of
/// input channels of each tile at a time, read from X in place (a pixel's channels are
/// contiguous), into V[36][T][C] (C padded to the vector); pass 2 broadcasts V[xi][t][c]; pass 3
/// stores each output pixel's channels through the epilogue, which then sees m = (b * OH + oh) *
/// OW + ow and n = oc, as the other channels-last templates' do.
///
/// The transformed weights U (G g G^T, computed in double; [36][M / KB][C][KB] for the KB output
/// channels of a register block, so that a block streams a contiguous strip) are 4x the size of
/// W (16/9 for F(2x2)), so the library keeps W as it is (the weight argument is W then the bias,
/// like the library choices') and the function transforms it on its first call with that weight
/// pointer, keeping the result for later calls; V and Mt live in per-thread buffers. The epilogue
/// (TemplateEpilogue) sees v (the biased sum), m = (b * M + oc) * OH + oh and n = ow, as the direct
/// template's does.
///
/// F(4x4)'s points are 0, +-1, +-2 and +-1/2 (F(2x2)'s 0 and +-1); in float32 the result is
/// within about 1e-5 of the direct convolution relative to the output's magnitude
/// (tests/unit/autotune/winograd_template_test.cpp checks 1e-4 at ResNet-50's 3x3 layers). Like
/// every choice it is benchmarked against the others, and it is the heuristic choice where it
/// measured fastest.

#include <string>

#include "autotune/conv_template.h"

namespace kiln::autotune {

/// Whether the Winograd template with output tiles of `tile` x `tile` (4 or 2) implements
/// `problem`: 3x3 kernel, stride 1, dilation 1, group 1, per-thread buffers V and Mt of at most
/// 256 MiB (32 MiB channels-last), and (NCHW) a tile row's input rows that fit the per-task stack
/// budget.
bool winograd_applies(const ConvProblem& problem, int tile = 4);

/// Renders the kernel source of F(tile x tile, 3x3) (one translation unit defining
/// `function_name` as extern "C"). Throws InternalError unless winograd_applies(problem, tile).
std::string render_winograd(TemplateIsa isa, int tile, const ConvProblem& problem,
                            const std::string& function_name,
                            const TemplateEpilogue& epilogue = {});

}  // namespace kiln::autotune
