"""The grader's diagnoses of declared mistakes in Chinese, for a notebook that records language zh.

A chapter's grading module declares its classic wrong answers in English (``Mistake.message``); here each
has its Chinese, keyed by that English, as ``contract.ZH`` keys the contract's sentences. A notebook of the
Chinese course records ``{"course": {"language": "zh"}}`` in its metadata (``make chapters`` writes it);
the grader then names a recognised mistake in Chinese (``diagnosis``) and says once, in Chinese, that the
remaining lines of its feedback are English (``ENGLISH_REST``). A message changed or added in a grading
module without its Chinese here is named by ``missing`` (and a fast test fails on it); until then the
grader falls back to the English message, so a Chinese notebook is never left without a diagnosis.
The capstone's diagnosis of a model that does not learn (which component's replacement fixes its training)
is here too: its sentences (``CAPSTONE_SAY``) and each component's description and hint (``CAPSTONE_ZH``).
"""

from __future__ import annotations

LANGUAGES = ("en", "zh")
"""The languages a notebook may record; any other value is graded as English."""

ENGLISH_REST = ("**说明**：对已知错误的诊断（“诊断”一行）用中文给出；评分器的其余各行（检查的内容、数值差异、"
                "报错信息）保持英文。")
"""What a Chinese notebook's feedback says once about the lines that stay English."""

#: The Chinese of every declared mistake's message, by its English.
ZH: dict[str, str] = {
    # chapter 1
    "the lookup is not multiplied by sqrt(d_model)":
        "查表结果没有乘以 sqrt(d_model)",
    "the lookup is divided by sqrt(d_model); the notes multiply by it":
        "查表结果除以了 sqrt(d_model)；笔记是乘以它",
    "the lookup is multiplied by d_model instead of sqrt(d_model)":
        "查表结果乘的是 d_model，而不是 sqrt(d_model)",
    "these are plain dot products: each vector must first be divided by its length":
        "这只是普通的点积：每个向量要先除以它的长度",
    "the lengths were taken over the wrong axis (dim=-2, across vectors); a vector's length is over its"
    " own entries, the last axis":
        "长度是沿错误的轴求的（dim=-2，跨向量）；向量的长度是对它自己的各分量求，即最后一个轴",
    "a zero vector gives 0/0 = NaN: clamp each length below at eps (norm.clamp_min(eps))":
        "零向量给出 0/0 = NaN：给每个长度设下限 eps（norm.clamp_min(eps)）",
    # chapter 2
    "sine and cosine are swapped: even columns take sin(pos * w_i), odd columns cos(pos * w_i)":
        "正弦和余弦放反了：偶数列取 sin(pos * w_i)，奇数列取 cos(pos * w_i)",
    "each dimension j got its own exponent j / d_model: i indexes dimension *pairs*, so columns 2i and"
    " 2i+1 share the frequency 10000^(-2i/d_model)":
        "每一维 j 都用了自己的指数 j / d_model：i 编号的是维度*对*，"
        "所以第 2i 列和第 2i+1 列共用频率 10000^(-2i/d_model)",
    "the exponent is i / d_model with i the pair index; it must be 2i / d_model":
        "指数写成了 i / d_model（i 是维度对的编号）；应当是 2i / d_model",
    "the sines fill the first half and the cosines the second; they must interleave (sin in even columns,"
    " cos in odd ones)":
        "正弦占了前一半、余弦占了后一半；它们应当交错排列（偶数列放 sin，奇数列放 cos）",
    "the first row is position 1; positions start at 0 (the first row is sin 0 = 0, cos 0 = 1)":
        "第一行对应位置 1；位置从 0 开始（第一行是 sin 0 = 0、cos 0 = 1）",
    "the slice skips row 0 of the table: a sequence of length n takes rows 0 .. n-1, pe[:, :n]":
        "切片跳过了表的第 0 行：长度为 n 的序列取第 0 .. n-1 行，即 pe[:, :n]",
    "x was multiplied by sqrt(d_model): that scale belongs to the embeddings (chapter 1), the positional"
    " encoding only adds":
        "x 乘了 sqrt(d_model)：这个缩放属于词嵌入（第 1 章），位置编码只做加法",
    "adding the float32 table to a lower-precision batch promoted the result to float32; cast the slice"
    " with .to(x.dtype)":
        "把 float32 的位置表加到精度更低的批次上，结果被提升成了 float32；"
        "请用 .to(x.dtype) 转换切片",
    "dropout is never applied: in training mode the sum x + pe[:, :len] goes through self.dropout":
        "从未施加 dropout：训练模式下，"
        "和 x + pe[:, :len] 要经过 self.dropout",
    "`pe` is a trainable nn.Parameter: the optimizer would change the table, which is fixed; register it"
    " as a buffer (self.register_buffer(\"pe\", ...))":
        "`pe` 是可训练的 nn.Parameter：优化器会改动这张本应固定的表；"
        "请把它注册为缓冲区（self.register_buffer(\"pe\", ...)）",
    "the signs of sin(k w_i) are swapped: this is R_(-k), which maps PE(pos) to PE(pos - k)":
        "sin(k w_i) 的符号反了：这是 R_(-k)，"
        "它把 PE(pos) 映射到 PE(pos - k)",
    "every pair turns by k radians: pair i must turn by k * w_i, with w_i = 10000^(-2i/d_model)":
        "每一对都转了 k 弧度：第 i 对应当转 k * w_i，"
        "其中 w_i = 10000^(-2i/d_model)",
    "the frequency exponent is i / d_model with i the pair index; it must be 2i / d_model":
        "频率的指数写成了 i / d_model（i 是维度对的编号）；应当是 2i / d_model",
    # chapter 3
    "the scores are not divided by sqrt(d_k) (missing scale): softmax saturates for large d_k":
        "得分没有除以 sqrt(d_k)（缺少缩放）：d_k 较大时 softmax 会饱和",
    "the scores are divided by d_k instead of sqrt(d_k)":
        "得分除的是 d_k，而不是 sqrt(d_k)",
    "softmax is taken over the wrong axis (the queries, dim=-2): each row must sum to 1 over the keys":
        "softmax 沿错误的轴计算（查询所在的 dim=-2）：每一行应当在键上求和为 1",
    "the mask is inverted: positions where mask == 1 were hidden instead of those where mask == 0":
        "掩码反了：被遮住的是 mask == 1 的位置，而应当是 mask == 0 的位置",
    "the mask is applied after softmax: masked weights were zeroed but the rows no longer sum to 1":
        "掩码在 softmax 之后才施加：被遮住的权重置成了零，但各行的和不再是 1",
    "masked scores are filled with -inf: a row whose keys are all masked becomes NaN; use a large finite"
    " negative number such as torch.finfo(dtype).min":
        "被遮住的得分填成了 -inf：所有键都被遮住的那一行会变成 NaN；请用一个很大的有限负数，"
        "例如 torch.finfo(dtype).min",
    "key is not transposed: the scores must be query @ key^T (key.transpose(-2, -1))":
        "键没有转置：得分应当是 query @ key^T（key.transpose(-2, -1)）",
    "p_attn is returned before dropout: return the dropped-out weights, the ones the output was computed"
    " with":
        "返回的 p_attn 是 dropout 之前的：请返回 dropout 之后的权重，"
        "也就是计算输出时用的那些",
    "the `scaled` argument is ignored: scaled=False must skip the 1/sqrt(d_k) factor":
        "忽略了参数 `scaled`：scaled=False 时必须去掉 1/sqrt(d_k) 这个因子",
    "the smallest weight of each row was returned; saturation is measured by the largest":
        "返回的是每行最小的权重；饱和程度要用最大的权重来衡量",
    # chapter 4
    "True marks the future positions (the upper triangle): in this course True means *may attend*, so"
    " position i sees j <= i; the notes' triu(..., diagonal=1) still needs `== 0`":
        "True 标在了未来的位置（上三角）：本课程中 True 表示*可以关注*，"
        "所以位置 i 能看到 j <= i；"
        "笔记里的 triu(..., diagonal=1) 还需要再加 `== 0`",
    "the diagonal is hidden: a position must see itself (j <= i, not j < i)":
        "对角线被遮住了：每个位置必须能看到自己（j <= i，而不是 j < i）",
    "the mask has shape (size, size): it needs a leading axis of 1, (1, size, size), to broadcast over"
    " the batch":
        "掩码的形状是 (size, size)：它需要在前面多一个长度为 1 的轴，"
        "即 (1, size, size)，才能在批次维上广播",
    "the mask is a float tensor of 0.0/1.0: return a bool tensor (`& ` with the padding mask needs one)":
        "掩码是取值 0.0/1.0 的浮点张量：请返回 bool 张量（与填充掩码做 `&` 需要它）",
    "tgt and tgt_y are not shifted: the decoder reads tgt[:, :-1] and must predict tgt[:, 1:]":
        "tgt 和 tgt_y 没有错开一位：解码器读入 tgt[:, :-1]，"
        "要预测 tgt[:, 1:]",
    "tgt_mask hides the future but not the padding: combine both masks with `&`":
        "tgt_mask 遮住了未来，却没有遮住填充：用 `&` 把两个掩码合起来",
    "tgt_mask hides the padding but not the future: combine it with subsequent_mask using `&`":
        "tgt_mask 遮住了填充，却没有遮住未来："
        "用 `&` 把它与 subsequent_mask 合起来",
    "ntokens counts the decoder input tgt; the loss is taken over the labels, so count non-pad tgt_y":
        "ntokens 数的是解码器的输入 tgt；损失是在标签上计算的，"
        "所以应当数 tgt_y 中非填充的词元",
    "the padding id 2 is hard-coded: use the `pad` argument":
        "把填充 id 2 写死了：请使用参数 `pad`",
    "hidden scores are filled with -inf: a row with every entry hidden becomes NaN; fill with"
    " torch.finfo(scores.dtype).min":
        "被遮住的得分填成了 -inf：一整行都被遮住时会变成 NaN；"
        "请填入 torch.finfo(scores.dtype).min",
    "hidden scores are filled with -1e9, which float16 cannot hold (its range ends at -65504); fill with"
    " torch.finfo(scores.dtype).min":
        "被遮住的得分填成了 -1e9，float16 表示不了这个数（它的范围到 -65504 为止）；"
        "请填入 torch.finfo(scores.dtype).min",
    "a large negative number is added to hidden scores instead of replacing them: a fully hidden row"
    " keeps its old ranking, and the addition can change the dtype; use masked_fill":
        "给被遮住的得分加上了一个很大的负数，而不是替换它们：全被遮住的行保留了原来的大小顺序，"
        "而且这个加法可能改变 dtype；请用 masked_fill",
    "the weights are zeroed after the softmax: the rows no longer sum to 1":
        "权重在 softmax 之后才置零：各行的和不再是 1",
    "the mask is inverted: entries where mask == 1 were hidden instead of those where mask == 0":
        "掩码反了：被遮住的是 mask == 1 的位置，而应当是 mask == 0 的位置",
    # chapter 5
    "the features were viewed as (batch, h, len, d_k) directly: each 'head' then holds pieces of several"
    " positions. View as (batch, len, h, d_k), then transpose(1, 2)":
        "特征被直接 view 成了 (batch, h, len, d_k)："
        "这样每个“头”拿到的是几个位置的碎片。应先 view 成 (batch, len, h, d_k)，"
        "再 transpose(1, 2)",
    "the heads are split but not moved in front of the positions: the result is (batch, len, h, d_k);"
    " transpose(1, 2)":
        "头拆开了，却没有移到位置轴前面：结果是 (batch, len, h, d_k)；"
        "还需要 transpose(1, 2)",
    "head i got every h-th feature (i, i + h, ...) instead of the block i*d_k .. (i+1)*d_k - 1":
        "第 i 个头拿到的是每隔 h 个取一个的特征（i、i + h、...），"
        "而不是第 i*d_k .. (i+1)*d_k - 1 这一整块",
    "the heads were merged without the transpose back: each row mixes several positions of one head."
    " transpose(1, 2) first, then contiguous().view":
        "合并各个头时没有先转置回来：每一行混进了同一个头的几个位置。先 transpose(1, 2)，"
        "再 contiguous().view",
    "view() after transpose() needs contiguous() (or use reshape)":
        "在 transpose() 之后调用 view() 需要先 contiguous()（或者改用 reshape）",
    "the heads' features are interleaved (feature j of every head side by side); each row should be head"
    " 0's d_k features, then head 1's, ...":
        "各个头的特征交错在一起了（每个头的第 j 个特征挨在一起）；"
        "每一行应当先是头 0 的 d_k 个特征，然后是头 1 的，……",
    "the heads were merged without transposing them back behind the positions: each output row mixes"
    " several positions":
        "合并各个头时没有把它们转置回位置轴之后：每一行输出都混进了几个位置",
    "the projections were viewed as (batch, h, len, d_k) directly: view as (batch, len, h, d_k), then"
    " transpose(1, 2)":
        "投影结果被直接 view 成了 (batch, h, len, d_k)："
        "应先 view 成 (batch, len, h, d_k)，再 transpose(1, 2)",
    "the scores are divided by sqrt(d_model); each head divides by sqrt(d_k), the width of its own keys":
        "得分除的是 sqrt(d_model)；每个头应当除以 sqrt(d_k)，即它自己的键的宽度",
    "W^O (linears[3]) is never applied: the heads are concatenated but not mixed":
        "从未使用 W^O（linears[3]）：各个头拼接起来了，却没有混合",
    "the mask has no head axis, so broadcasting lines the batch up with the heads: give every head the"
    " same mask with mask.unsqueeze(1)":
        "掩码没有头的轴，于是广播时批次维对上了头的维："
        "用 mask.unsqueeze(1) 让每个头用同一个掩码",
    "query, key and value all go through linears[0]: each has its own projection, linears[0], [1], [2]":
        "查询、键和值都经过了 linears[0]：它们各有自己的投影，"
        "分别是 linears[0]、[1]、[2]",
    "dropout was applied to the output; the notes apply it to the attention weights (pass"
    " dropout=self.dropout to attention)":
        "dropout 作用在了输出上；"
        "笔记把它作用在注意力权重上（把 dropout=self.dropout 传给 attention）",
    # chapter 6
    "the result is computed with matrix products, not with convolutions: the exercise asks for two "
    "1-D convolutions of kernel size 1 (`nn.Conv1d` layers or `F.conv1d`)":
        "结果是用矩阵乘法算出来的，而不是用卷积：练习要求两个卷积核大小为 1 的一维卷积（`nn.Conv1d` 层或 `F.conv1d`）",
    "there is no ReLU between w_1 and w_2: the two layers collapse into one linear map":
        "w_1 和 w_2 之间没有 ReLU：两层线性变换塌缩成了一个线性映射",
    "the ReLU is applied to the output of w_2; it belongs between w_1 and w_2":
        "ReLU 作用在了 w_2 的输出上；它应当位于 w_1 和 w_2 之间",
    "GELU is used where the notes' FFN has a ReLU (the trained weights expect the ReLU)":
        "在笔记的前馈网络用 ReLU 的地方用了 GELU（训练好的权重是按 ReLU 得到的）",
    "dropout is applied to the input x, before w_1; the notes apply it to the hidden activations, after"
    " the ReLU":
        "dropout 作用在输入 x 上，在 w_1 之前；笔记把它作用在隐藏层激活上，即 ReLU 之后",
    "dropout is applied to the output of w_2; the notes apply it to the hidden activations, before w_2":
        "dropout 作用在 w_2 的输出上；笔记把它作用在隐藏层激活上，即 w_2 之前",
    "the activation stops at 6 (ReLU6, or a clamp at 6): the ReLU of equation (6.2) is max(0, z), with no"
    " upper limit":
        "激活函数在 6 处截断了（ReLU6，或者在 6 处 clamp）："
        "式 (6.2) 的 ReLU 是 max(0, z)，没有上限",
    "the input was reshaped to (batch, d_model, seq_len) instead of transposed: the numbers stay in place"
    " and are read as the wrong channels. Use x.transpose(1, 2)":
        "输入被 reshape 成了 (batch, d_model, seq_len)，而不是转置："
        "数值留在原处，被当成了错误的通道来读。请用 x.transpose(1, 2)",
    "the result is still (batch, d_model, seq_len): transpose it back to (batch, seq_len, d_model)":
        "结果仍然是 (batch, d_model, seq_len)："
        "要把它转置回 (batch, seq_len, d_model)",
    "the weight was transposed before it became a kernel: nn.Linear and Conv1d both store (out, in); add"
    " the kernel axis with unsqueeze(-1) only":
        "权重在变成卷积核之前被转置了：nn.Linear 和 Conv1d 存储的都是 (out, in)；"
        "只需用 unsqueeze(-1) 加上卷积核的轴",
    "there is no ReLU between the two convolutions":
        "两个卷积之间没有 ReLU",
    "the activation stops at 6 (ReLU6, or a clamp at 6): the FFN's ReLU is max(0, z), with no upper limit":
        "激活函数在 6 处截断了（ReLU6，或者在 6 处 clamp）："
        "前馈网络的 ReLU 是 max(0, z)，没有上限",
    "this is the tanh approximation of GELU (off by up to about 5e-4); use the exact x * (1 + erf(x /"
    " sqrt(2))) / 2":
        "这是 GELU 的 tanh 近似（误差最大约 5e-4）；"
        "请用精确形式 x * (1 + erf(x / sqrt(2))) / 2",
    "this is the sigmoid approximation x * sigmoid(1.702 x); use the exact x * Phi(x)":
        "这是 sigmoid 近似 x * sigmoid(1.702 x)；"
        "请用精确形式 x * Phi(x)",
    "erf(x) is not the normal CDF: Phi(x) = (1 + erf(x / sqrt(2))) / 2":
        "erf(x) 不是正态分布的累积分布函数："
        "Phi(x) = (1 + erf(x / sqrt(2))) / 2",
    "the factor 1/2 is missing: Phi(x) = (1 + erf(x / sqrt(2))) / 2":
        "缺少因子 1/2：Phi(x) = (1 + erf(x / sqrt(2))) / 2",
    # chapter 7
    "the standard deviation divides by d (biased); the notes' LayerNorm uses x.std(-1), which divides by"
    " d - 1":
        "标准差除的是 d（有偏）；笔记的 LayerNorm 用 x.std(-1)，除的是 d - 1",
    "eps is added inside the square root, sqrt(var + eps); the notes add it to the standard deviation: (x"
    " - mean) / (std + eps)":
        "eps 加在了平方根里面，即 sqrt(var + eps)；笔记是把它加到标准差上："
        "(x - mean) / (std + eps)",
    "this is nn.LayerNorm's formula (biased variance, eps inside the root); the notes' flavour divides by"
    " the unbiased std plus eps":
        "这是 nn.LayerNorm 的公式（有偏方差，eps 在根号内）；"
        "笔记的写法是除以无偏标准差加 eps",
    "eps is never used: divide by (std + eps); it matters for vectors whose spread is tiny":
        "从未用到 eps：请除以 (std + eps)；对分布范围很小的向量，这一点很要紧",
    "a_2 and b_2 are created but never used: the output is the normalized x alone; the layer must return"
    " a_2 * normalized + b_2, so that training can rescale and shift each feature":
        "a_2 和 b_2 建好了却从未使用：输出只是归一化后的 x；"
        "这一层必须返回 a_2 * normalized + b_2，训练才能对每个特征做缩放和平移",
    "the mean and std run over the positions (axis -2); layer normalization uses each token's own"
    " features, the last axis":
        "均值和标准差是沿位置轴（axis -2）求的；层归一化用的是每个词元自己的特征，即最后一个轴",
    "eps is fixed at 1e-6: use the eps given to the constructor (self.eps)":
        "eps 固定成了 1e-6：请使用传给构造函数的 eps（self.eps）",
    "the Pre-LN form normalizes after the add, norm(x + sublayer(x)): that is Post-LN; Pre-LN is x +"
    " dropout(sublayer(norm(x)))":
        "Pre-LN 形式写成了先相加再归一化 norm(x + sublayer(x))："
        "那是 Post-LN；Pre-LN 是 x + dropout(sublayer(norm(x)))",
    "the residual connection is missing: add the input x to the sublayer's output":
        "缺少残差连接：要把输入 x 加到子层的输出上",
    "the residual adds norm(x) instead of x: the stream that goes around the sublayer is the input"
    " itself, unnormalized":
        "残差加的是 norm(x) 而不是 x：绕过子层的那条通路就是输入本身，不做归一化",
    "dropout is applied to the sum, residual included; it belongs on the sublayer's output only":
        "dropout 作用在了包括残差在内的和上；它只应作用在子层的输出上",
    "dropout is never applied: in training mode the sublayer's output goes through self.dropout":
        "从未施加 dropout：训练模式下，子层的输出要经过 self.dropout",
    "norm_position=\"post\" is ignored: the paper's Post-LN form is norm(x + dropout(sublayer(x))), the"
    " norm after the residual sum":
        "忽略了 norm_position=\"post\"："
        "论文的 Post-LN 形式是 norm(x + dropout(sublayer(x)))，"
        "归一化在残差相加之后",
    # chapter 8
    "the two sublayers share one SublayerConnection (`[SublayerConnection(...)] * 2`): the attention and"
    " the feed-forward network each need their own LayerNorm, so use clones(..., 2)":
        "两个子层共用了一个 SublayerConnection（`[SublayerConnection(...)] * 2`）："
        "注意力和前馈网络各需要自己的 LayerNorm，所以请用 clones(..., 2)",
    "the feed-forward network runs before the self-attention: equation (8.1) attends first (sublayer[0]),"
    " then transforms each token (sublayer[1])":
        "前馈网络在自注意力之前运行：式 (8.1) 先做注意力（sublayer[0]），"
        "再对每个词元做变换（sublayer[1]）",
    "the self-attention reads x, not the normalized y that SublayerConnection passes to the lambda: write"
    " lambda y: self.self_attn(y, y, y, mask)":
        "自注意力读的是 x，"
        "而不是 SublayerConnection 传给 lambda 的归一化后的 y："
        "应写成 lambda y: self.self_attn(y, y, y, mask)",
    "the mask never reaches the self-attention: padded tokens are attended to":
        "掩码没有传到自注意力：填充的词元也被关注了",
    "the cross-attention is masked with tgt_mask; its keys are source positions, so it takes src_mask"
    " (the target's mask has the wrong shape, and its causal part makes no sense for a known source)":
        "交叉注意力用的是 tgt_mask；它的键是源位置，"
        "所以应当用 src_mask（目标掩码的形状不对，而且对一个已知的源序列，因果那部分也没有意义）",
    "the cross-attention takes its keys and values from the decoder (src_attn(y, y, y, ...)): they come"
    " from the memory, src_attn(y, memory, memory, src_mask)":
        "交叉注意力的键和值取自解码器（src_attn(y, y, y, ...)）："
        "它们应当来自 memory，"
        "即 src_attn(y, memory, memory, src_mask)",
    "the masked self-attention gets no mask: every position sees the future; pass tgt_mask":
        "掩码自注意力没有拿到掩码：每个位置都看到了未来；请传入 tgt_mask",
    "the cross-attention runs before the masked self-attention: the order is self-attention"
    " (sublayer[0]), cross-attention (sublayer[1]), feed-forward (sublayer[2])":
        "交叉注意力在掩码自注意力之前运行："
        "顺序是自注意力（sublayer[0]）、交叉注意力（sublayer[1]）、前馈网络（sublayer[2]）",
    "the three sublayers share one SublayerConnection (`[SublayerConnection(...)] * 3`): each needs its"
    " own LayerNorm, so use clones(..., 3)":
        "三个子层共用了一个 SublayerConnection（`[SublayerConnection(...)] * 3`）："
        "每个子层都需要自己的 LayerNorm，所以请用 clones(..., 3)",
    "the memory goes through the sublayer's LayerNorm too: only the query y is normalized there; the"
    " memory was normalized once, by the encoder's final norm":
        "memory 也经过了子层的 LayerNorm：那里只归一化查询 y；"
        "memory 已经由编码器最后的归一化层归一化过一次",
    "the stack repeats one layer (`nn.ModuleList([layer] * N)`): one set of weights used N times."
    " clones(layer, N) makes N independent deep copies":
        "整个堆叠重复的是同一个层（`nn.ModuleList([layer] * N)`）："
        "一组权重用了 N 次。clones(layer, N) 才会做出 N 个独立的深拷贝",
    "the final LayerNorm is missing: a Pre-LN stack's residual stream is never normalized otherwise;"
    " return self.norm(x) after the last layer":
        "缺少最后的 LayerNorm：否则 Pre-LN 堆叠的残差流从未被归一化；"
        "请在最后一层之后返回 self.norm(x)",
    "the final norm is applied after every layer; it runs once, after the last one":
        "最后的归一化在每一层之后都做了一次；它只在最后一层之后做一次",
    "the layers are called with the masks swapped: layer(x, memory, src_mask, tgt_mask)":
        "调用各层时两个掩码传反了："
        "应为 layer(x, memory, src_mask, tgt_mask)",
    "the final norm is nn.LayerNorm: the course's LayerNorm (the notes' a_2 and b_2, unbiased std, eps"
    " added to the std) is the one the checkpoints and the rest of the model use":
        "最后的归一化层用的是 nn.LayerNorm："
        "检查点和模型其余部分用的是本课程的 LayerNorm（笔记中的 a_2 和 b_2、无偏标准差、eps 加在标准差上）",
    "the attention prototype is used itself instead of deep copies: each decoder layer's self-attention"
    " and cross-attention are one module with one set of weights; write c(attn) at every use":
        "直接使用了注意力原型，而不是它的深拷贝："
        "每个解码器层的自注意力和交叉注意力成了同一个模块、同一组权重；每次使用都要写 c(attn)",
    "the matrices keep PyTorch's default initialization: re-initialize every parameter with more than one"
    " dimension with nn.init.xavier_uniform_ after building the model":
        "矩阵保留了 PyTorch 的默认初始化：模型建好之后，"
        "要用 nn.init.xavier_uniform_ 重新初始化每个维数大于一的参数",
    "the matrices are drawn from Xavier's normal distribution; the notes use xavier_uniform_ (bounded by"
    " sqrt(6 / (fan_in + fan_out)))":
        "矩阵是从 Xavier 正态分布中抽取的；"
        "笔记用的是 xavier_uniform_（界为 sqrt(6 / (fan_in + fan_out))）",
    "MultiHeadedAttention is built without the dropout rate, so it keeps its default 0.1 (the notes'"
    " slip): pass dropout to every module":
        "构建 MultiHeadedAttention 时没有传入 dropout 比率，"
        "于是它保留了默认的 0.1（笔记的疏漏）：请把 dropout 传给每个模块",
    "the embeddings get no positional encoding: src_embed and tgt_embed are"
    " nn.Sequential(Embeddings(...), c(position))":
        "词嵌入没有加上位置编码："
        "src_embed 和 tgt_embed 应当是 nn.Sequential(Embeddings(...), c(position))",
    "the source embedding is built with tgt_vocab and the target one with src_vocab":
        "源语言的词嵌入用 tgt_vocab 构建，目标语言的却用了 src_vocab",
    "the output layer is a bare nn.Linear: the generator is Generator(d_model, tgt_vocab), the linear map"
    " `proj` followed by log_softmax":
        "输出层只是一个 nn.Linear："
        "生成器应当是 Generator(d_model, tgt_vocab)，"
        "即线性映射 `proj` 后接 log_softmax",
    # chapter 9
    "ε is spread as smoothing / (size - 1): it is shared by size - 2 classes (every class but the label"
    " and the padding class), so each gets smoothing / (size - 2)":
        "ε 按 smoothing / (size - 1) 分摊："
        "它由 size - 2 个类别分享（除标签和填充类之外的每个类别），"
        "所以每个类别得到 smoothing / (size - 2)",
    "the padding column of the target is not 0: the model must never be taught to predict padding":
        "目标分布的填充列不是 0：绝不能教模型去预测填充",
    "rows whose label is padding are not all zero: padded positions must add nothing to the loss":
        "标签为填充的那些行不全为零：填充的位置不应给损失带来任何贡献",
    "the KL divergence is averaged (reduction='mean'); the notes sum it (reduction='sum') and"
    " SimpleLossCompute divides by ntokens":
        "KL 散度取了平均（reduction='mean'）；"
        "笔记是求和（reduction='sum'），"
        "再由 SimpleLossCompute 除以 ntokens",
    "this is the cross-entropy against the smoothed target, -sum q log p; the KL divergence also"
    " subtracts the target's entropy: sum q (log q - log p)":
        "这是对平滑后目标的交叉熵 -sum q log p；KL 散度还要减去目标分布的熵："
        "sum q (log q - log p)",
    "step 0 is not treated as step 1: 0 ** -0.5 divides by zero (LambdaLR asks for step 0 when it is"
    " created)":
        "第 0 步没有按第 1 步处理："
        "0 ** -0.5 会除以零（LambdaLR 在创建时就会请求第 0 步的值）",
    "the warm-up term uses warmup ** -0.5: it is step * warmup ** -1.5, so that the two terms meet at"
    " step == warmup":
        "预热项用的是 warmup ** -0.5：它应当是 step * warmup ** -1.5，"
        "这样两项恰好在 step == warmup 处相交",
    "max instead of min: the rate must follow the smaller of the two terms (the ramp, then the decay)":
        "用了 max 而不是 min：学习率要取两项中较小的那个（先线性上升，再衰减）",
    "the factor d_model ** -0.5 is missing: wider models need smaller rates":
        "缺少因子 d_model ** -0.5：模型越宽，学习率应当越小",
    "each micro-batch's loss is its own mean (norm = its ntokens), so the accumulated gradient is the sum"
    " of the group's means, about accum_iter times too large: divide every micro-batch's summed loss by"
    " the group's total ntokens":
        "每个微批次的损失取的是它自己的平均（norm = 它的 ntokens），"
        "于是累积的梯度是这一组各平均值之和，大约大了 accum_iter 倍："
        "应当把每个微批次求和的损失除以这一组的总 ntokens",
    "each micro-batch's mean loss is divided by accum_iter: right only when every micro-batch holds as"
    " many tokens; divide the summed losses by the group's total ntokens, equation (9.5)":
        "每个微批次的平均损失除以了 accum_iter：只有每个微批次的词元数都相同时才对；"
        "应当把求和的损失除以这一组的总 ntokens，见式 (9.5)",
    "the optimizer steps when i % accum_iter == 0, already after the first micro-batch (i = 0): the"
    " groups are shifted and the last micro-batches never make a step":
        "优化器在 i % accum_iter == 0 时更新，第一个微批次（i = 0）之后就更新了："
        "分组错开了，最后那些微批次从未参与更新",
    "the scheduler steps once per micro-batch: the schedule counts optimizer steps, so step it once per"
    " group, after optimizer.step()":
        "调度器每个微批次更新一次：学习率调度数的是优化器的步数，所以每组只更新一次，"
        "放在 optimizer.step() 之后",
    "the micro-batches left after the last full group make no step: a shorter last group still makes one":
        "最后一个完整分组之后剩下的微批次没有做更新：较短的最后一组也要做一次更新",
    "the gradients are never zeroed after a step: each group's gradient adds to the previous ones'":
        "每次更新之后梯度从未清零：每一组的梯度都叠加到了前面各组的梯度上",
    "the model is not put in training mode (model.train()): dropout stays off while training":
        "模型没有切换到训练模式（model.train()）：训练时 dropout 一直是关闭的",
    # chapter 10
    "top-p drops the token that crosses p: keep each token while the mass *before* it is below p, so the"
    " kept set reaches p":
        "top-p 去掉了越过 p 的那个词元：只要排在它*之前*的概率之和小于 p 就保留它，"
        "这样保留下来的集合恰好达到 p",
    "top-p keeps one token too many: the token after the one that crosses p must go":
        "top-p 多保留了一个词元：越过 p 的那个词元之后的词元必须去掉",
    "top-p was measured on the original distribution; it applies to what top-k left, renormalised":
        "top-p 是在原始分布上衡量的；它应当作用在 top-k 留下、并重新归一化之后的分布上",
    "the running mass was summed in vocabulary order; sort the probabilities, largest first":
        "累积概率是按词表顺序求和的；应当先把概率从大到小排序",
    "the running mass was summed in float32: a dominant token's probability rounds to 1.0 and the tail is"
    " cut before p is reached (p = 1 must keep everything)":
        "累积概率是用 float32 求和的：占主导的词元的概率被舍入成 1.0，"
        "尾部在达到 p 之前就被截掉了（p = 1 必须保留全部）",
    "top_p = 1 still filtered: p >= 1 means no filtering (the mass can round to 1.0 before the tail)":
        "top_p = 1 时仍然做了过滤：p >= 1 表示不过滤（在到达尾部之前，"
        "累积概率就可能舍入成 1.0）",
    "top-k kept k - 1 tokens: keep the logits >= the k-th largest (`logits < kth` are removed)":
        "top-k 只保留了 k - 1 个词元："
        "应保留 >= 第 k 大值的 logits（去掉的是 `logits < kth`）",
    "returned probabilities; return the logits, with the removed ones set to -inf":
        "返回的是概率；应当返回 logits，并把被去掉的设为 -inf",
    "exactly top_k tokens were kept, so a token tied with the k-th largest logit was removed: keep every"
    " token whose logit is at least the k-th largest":
        "恰好保留了 top_k 个词元，于是与第 k 大的 logit 打平的词元被去掉了："
        "logit 不小于第 k 大值的词元都要保留",
    "a token whose preceding mass equals top_p exactly was kept: keep a token only while the mass before"
    " it is below top_p (before < top_p), so the kept set just reaches p":
        "前面的概率之和恰好等于 top_p 的词元被保留了："
        "只有当它之前的概率之和小于 top_p（before < top_p）时才保留，"
        "这样保留的集合恰好达到 p",
    "the beams' scores were not added: a candidate's score is scores[parent] + log_probs[parent, token]":
        "没有加上各束的得分："
        "一个候选的得分是 scores[parent] + log_probs[parent, token]",
    "each beam kept only its own best continuation: prune the k * vocab candidates of a sentence"
    " together, so a good beam can have several children":
        "每一束只保留了它自己最好的那个延续：应当把一个句子的 k * vocab 个候选放在一起剪枝，"
        "这样一个好的束可以有几个子节点",
    "parents and tokens are swapped: for the flat index j * vocab + v the parent is // vocab, the token %"
    " vocab":
        "parents 和 tokens 对调了：对展平后的下标 j * vocab + v，"
        "parent 是 // vocab，token 是 % vocab",
    "the worst candidates were kept (topk with largest=False); keep the best, best first":
        "保留的是最差的候选（topk 用了 largest=False）；应保留最好的，从最好的排起",
    "log-probabilities were multiplied; they are added (probabilities multiply, their logs add)":
        "对数概率做了乘法；它们应当相加（概率相乘，对数相加）",
    "parents are rows of the flattened batch (b * k + j); return the beam index j within the sentence":
        "parents 是展平后批次的行号（b * k + j）；应返回句子内部的束编号 j",
    # chapter 11
    "the query attended to the cached positions only: append the new key and value first, the newest"
    " position must see itself":
        "查询只关注了缓存中的位置：应先把新的键和值追加进去，最新的位置必须能看到自己",
    "the new key and value were appended twice":
        "新的键和值被追加了两次",
    "a causal mask was applied to the single query row: its first row hides every cached position but the"
    " first; with a cache every key is in the query's past, so no mask is needed":
        "对单独一行查询施加了因果掩码：它的第一行遮住了除第一个以外的所有缓存位置；有了缓存，"
        "每个键都在查询的过去，不需要掩码",
    "the heads were merged but W^O (self.linears[-1]) was not applied":
        "各个头合并了，但没有使用 W^O（self.linears[-1]）",
    "the returned k, v hold only the new position: return the whole cache, old positions first":
        "返回的 k、v 只包含新位置：应返回整个缓存，旧的位置在前",
    "the cache was concatenated along dim=1 (the heads); positions are dim=2 of (batch, h, t, d_k)":
        "缓存沿 dim=1（头的轴）拼接了；在 (batch, h, t, d_k) 中，位置是 dim=2",
    "only the keys (or only the values) were counted, as in the notes' formula: the cache holds both,"
    " twice as much":
        "只数了键（或只数了值），就像笔记的公式那样：缓存里两者都有，是它的两倍",
    "the layers were not multiplied in: every decoder layer has its own cache":
        "没有乘上层数：每个解码器层都有自己的缓存",
    "the cross-attention cache (src_len source positions) was left out":
        "漏掉了交叉注意力的缓存（src_len 个源位置）",
    "the result is in bits: one number takes `dtype` bytes, not 8 times as many":
        "结果的单位是比特：一个数占 `dtype` 个字节，而不是它的 8 倍",
    "every number was counted as 4 bytes: use the bytes of `dtype` (2 for float16, 1 for int8, ...)":
        "每个数都按 4 字节计算了：应使用 `dtype` 的字节数（float16 是 2，"
        "int8 是 1，……）",
}


#: The capstone's diagnosis of a model that does not learn (``autograder.capstone``) in Chinese: its sentences,
#: by their key in ``capstone.SAY`` and with the same ``{...}`` fields; then, in ``CAPSTONE_ZH``, the name,
#: description and hint of each component it may replace.
CAPSTONE_SAY: dict[str, str] = {
    "greedy": "**诊断：贪心解码**（第 10 章）：你的模型已经学会了这个任务，因为送入正确的前缀时，它能把 {forced:.1%} "
              "的留出序列的每个词元都预测对；但你的 `greedy_decode` 只把其中 {accuracy:.1%} 正确逆序。"
              "检查它怎样把选出的词元送回去、怎样取最后一个位置的预测，以及怎样在 `</s>` 处停下。",
    "alone": "**诊断：{name}**（{what}）：换上课程的版本、你的其余代码保持不变时，你的模型能学会这个任务（{yours}）。"
             "提示：{hint}。\n\n评分器像 A 部分那样，把你的部分代码换成课程的版本，重新训练了你的模型（{cost}）；"
             "下面的比例是：送入正确前缀时，模型把每个词元都预测对的留出序列所占的比例：\n\n{tried}",
    "several": "**诊断：不止一个组件**（{yours}）。只有用课程的组件替换你的组件、一直替换到{what}为止时，"
               "你的模型才能学会；只替换这一个还不够，所以至少还有一个组件需要检查。提示：{hint}。"
               "\n\n这几次运行（{cost}）：\n\n{tried}",
    "cost": "又训练了 {runs} 次，训练共用 {cpu:.0f} 秒 CPU 时间",
    "run": "换上课程的{names}：{outcome}",
    "names": "、",
    "yours": "你的模型能把 {accuracy:.1%} 的序列正确逆序，送入正确前缀时能把 {forced:.1%} 的序列全部预测对",
    "raised": "你自己的那次训练出错了",
}

#: The components' names, descriptions and hints (``ch12_capstone.COMPONENTS``), by their English (a name that
#: is code, such as ``make_model``, stays as it is).
CAPSTONE_ZH: dict[str, str] = {
    "masks": "掩码",
    "chapter 4's `subsequent_mask` and `Batch`": "第 4 章的 `subsequent_mask` 和 `Batch`",
    "look at the masks your `Batch` builds: every target position must see itself and the positions before it "
    "(and no padding), and `tgt`/`tgt_y` must be the target shifted by one":
        "检查你的 `Batch` 构建的掩码：每个目标位置都必须能看到它自己和它之前的位置（并且看不到填充），"
        "`tgt`/`tgt_y` 必须是目标序列错开一位的结果",
    "attention": "注意力",
    "chapter 3's `attention`": "第 3 章的 `attention`",
    "look at your `attention`: the weights must come from the scaled scores with the mask applied, and the "
    "output must stay connected to them (no `.detach()`, no `torch.no_grad()`), or the queries and keys never learn":
        "检查你的 `attention`：权重必须来自施加了掩码的缩放得分，输出必须与权重保持连接"
        "（不能有 `.detach()`，不能有 `torch.no_grad()`），否则查询和键永远学不到东西",
    "multi-head attention": "多头注意力",
    "chapter 5's `MultiHeadedAttention`, `split_heads` and `merge_heads`":
        "第 5 章的 `MultiHeadedAttention`、`split_heads` 和 `merge_heads`",
    "look at your `MultiHeadedAttention`: each of query, key and value has its own projection, the heads are split "
    "and merged back in the same order, and gradients reach every projection":
        "检查你的 `MultiHeadedAttention`：查询、键和值各有自己的投影，各个头按同样的顺序拆分、再合并回去，"
        "并且梯度能到达每一个投影",
    "feed-forward": "前馈网络",
    "chapter 6's `PositionwiseFeedForward`": "第 6 章的 `PositionwiseFeedForward`",
    "look at your `PositionwiseFeedForward`: w_2(dropout(relu(w_1(x)))), with gradients reaching both layers":
        "检查你的 `PositionwiseFeedForward`：应为 w_2(dropout(relu(w_1(x))))，并且梯度能到达两个线性层",
    "chapter 7's `LayerNorm`": "第 7 章的 `LayerNorm`",
    "look at your `LayerNorm`: it normalizes each token over its features and its gain and bias are learned":
        "检查你的 `LayerNorm`：它要在每个词元的各个特征上做归一化，增益和偏置都是可学习的",
    "chapter 7's `SublayerConnection`": "第 7 章的 `SublayerConnection`",
    "look at your `SublayerConnection`: x + dropout(sublayer(norm(x))), with the sublayer's output (and its "
    "gradient) reaching the residual sum":
        "检查你的 `SublayerConnection`：应为 x + dropout(sublayer(norm(x)))，子层的输出（及其梯度）要进入残差相加",
    "encoder and decoder layers": "编码器层和解码器层",
    "chapter 8's `EncoderLayer`, `DecoderLayer` and `Decoder`": "第 8 章的 `EncoderLayer`、`DecoderLayer` 和 `Decoder`",
    "look at your layers: the decoder's cross-attention takes its queries from the decoder and its keys and values "
    "from the encoder's memory, with the source mask; each sublayer gets the right mask":
        "检查你的各层：解码器的交叉注意力从解码器取查询，从编码器的 memory 取键和值，并使用源序列的掩码；"
        "每个子层都要拿到正确的掩码",
    "embeddings": "词嵌入",
    "chapter 1's `Embeddings`": "第 1 章的 `Embeddings`",
    "look at your `Embeddings`: one learned row per id, scaled by sqrt(d_model)":
        "检查你的 `Embeddings`：每个 id 对应可学习的一行，再乘以 sqrt(d_model)",
    "positional encoding": "位置编码",
    "chapter 2's `PositionalEncoding` and `positional_encoding`": "第 2 章的 `PositionalEncoding` 和 `positional_encoding`",
    "look at your `PositionalEncoding`: every position of every batch, in training as in evaluation, gets its own "
    "row of the table added; reversing a sequence is impossible without knowing where each symbol is":
        "检查你的 `PositionalEncoding`：无论训练还是评估，每个批次的每个位置都要加上表中属于它自己的那一行；"
        "不知道每个符号在哪里，就不可能把序列逆序",
    "glue": "粘合代码",
    "this chapter's `clones`, `Encoder`, `Generator` and `EncoderDecoder`":
        "本章的 `clones`、`Encoder`、`Generator` 和 `EncoderDecoder`",
    "look at this chapter's glue: `clones` makes independent deep copies, the generator returns log-probabilities, "
    "and `EncoderDecoder` encodes the source once and decodes the target against that memory":
        "检查本章的粘合代码：`clones` 生成相互独立的深拷贝，generator 返回对数概率，"
        "`EncoderDecoder` 对源序列只编码一次，再对照这个 memory 解码目标序列",
    "chapter 8's `make_model`": "第 8 章的 `make_model`",
    "look at your `make_model`: separate deep copies of every attention and feed-forward module, the dropout "
    "passed everywhere, Xavier initialization of the matrices; your pieces each work with the course's others":
        "检查你的 `make_model`：每个注意力模块和前馈模块都是各自独立的深拷贝，dropout 传到了每一处，"
        "矩阵用 Xavier 初始化；你的每个部件与课程的其他部件搭配时都能正常工作",
    "loss": "损失",
    "chapter 9's `LabelSmoothing` and this chapter's `SimpleLossCompute`":
        "第 9 章的 `LabelSmoothing` 和本章的 `SimpleLossCompute`",
    "look at your loss: the generator's log-probabilities against the smoothed target, padding given nothing, "
    "summed and divided by the norm it is given":
        "检查你的损失：拿 generator 的对数概率与平滑后的目标比较，填充不分得任何概率，求和后再除以传入的 norm",
    "schedule": "学习率调度",
    "chapter 9's `rate`": "第 9 章的 `rate`",
    "look at your `rate`: it rises linearly for `warmup` steps and then decays as 1/sqrt(step), for every step":
        "检查你的 `rate`：它在 `warmup` 步内线性上升，之后按 1/sqrt(step) 衰减，每一步都是如此",
    "training loop": "训练循环",
    "chapter 9's `train_with_accumulation`": "第 9 章的 `train_with_accumulation`",
    "look at your `train_with_accumulation`: every micro-batch is used, the optimizer and the scheduler step once "
    "per group, and the gradients are cleared after each step":
        "检查你的 `train_with_accumulation`：每个微批次都要用上，优化器和调度器每组只更新一次，"
        "每次更新之后要清空梯度",
}


def diagnosis(name: str, message: str, language: str = "en") -> str:
    """The feedback line naming the declared mistake ``name``: in Chinese for "zh" when ``ZH`` has its message."""
    if language == "zh" and message in ZH:
        return f"**诊断：{name}**：{ZH[message]}。"
    return f"**Diagnosis: {name}**: {message}."


def missing() -> list[str]:
    """``"exercise id: name"`` of every declared mistake of the registry whose message has no Chinese in ``ZH``,
    and ``"ch12 diagnosis: name"`` of every capstone component whose description or hint has none in ``CAPSTONE_ZH``."""
    from autograder.exercises.ch12_capstone import COMPONENTS
    from autograder.registry import REGISTRY

    return [f"{e.id}: {name}" for e in REGISTRY for name, m in e.mistakes.items() if m.message not in ZH] + \
        [f"ch12 diagnosis: {c[0]}" for c in COMPONENTS if c[1] not in CAPSTONE_ZH or c[4] not in CAPSTONE_ZH]
