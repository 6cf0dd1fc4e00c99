"""CUDA's own answers for the AMP corpus scripts, recorded on an NVIDIA H200 (torch 2.11.0+cu130).

Recorded by running the scripts natively there, with no dmlshim: ``python
tests/corpus/amp_ops.py --values`` (``OPS``: each case's output dtype and float64 sum) and
``python tests/corpus/amp_models.py`` (``MODELS``: the losses of the CUDA mixed-precision recipe).
tests/test_amp.py compares the same scripts under dmlshim on the emulated DirectML device with
these lines. Re-record them when a script's cases or models change.
"""

OPS = """
case mm float16 -8.0518798828125
case mm_16_32 float16 -1.500762939453125
case matmul float16 -8.0518798828125
case bmm float16 18.91400146484375
case baddbmm float16 16.8358154296875
case addmm float16 -9.9593505859375
case addbmm float16 17.007219314575195
case addmv float16 -4.10009765625
case addr float16 -0.4095458984375
case mv float16 -2.87548828125
case linear float16 -7.615234375
case einsum float16 -8.0518798828125
case chain_matmul float16 17.28369140625
case conv1d float16 6.2860107421875
case conv2d float16 -199.7974395751953
case conv2d_16_32 float16 -52.226036071777344
case conv3d float16 66.66436767578125
case conv_transpose2d float16 59.28575134277344
case prelu float16 132.30374145507812
case lstm_cell float16 -0.556191623210907
case gru_cell float16 -0.870849609375
case rnn_tanh_cell float16 -6.0338134765625
case sdpa float16 -7.649386882781982
case exp_16 float32 26.62719587981701
case log_16 float32 6.918573617935181
case pow_16 float32 12.469818959012628
case pow_16_16 float32 18.024309715783602
case rsqrt_16 float32 13.054442822933197
case reciprocal_16 float32 55.131298780441284
case softplus_16 float32 13.00081479549408
case layer_norm_16 float32 8.940696716308594e-08
case group_norm_16 float32 -1.595763023942709e-06
case mse_loss_16_32 float32 1.3136301040649414
case l1_loss_16 float32 1.2563705444335938
case smooth_l1_loss_16 float32 0.8909581899642944
case huber_loss_16 float32 0.8909581899642944
case kl_div_16 float32 nan
case bce_with_logits_16 float32 0.7284761071205139
case nll_loss_16 float32 0.236236572265625
case cross_entropy_16 float32 2.022216796875
case cosine_similarity_16 float32 -0.49538350850343704
case cdist_16 float32 47.41290760040283
case logsumexp_16 float32 7.142473936080933
case upsample_nearest_16 float32 -23.742691040039062
case upsample_bilinear_16 float32 -23.742691159248352
case dist_16 float32 6.914536476135254
case softmax_16 float32 4.000000033527613
case softmax_16_dtype16 float16 4.000213623046875
case log_softmax_16 float32 -27.53925582766533
case sum_16 float32 1.0306396484375
case sum_dim_16 float32 1.0306396484375
case prod_16 float32 2.8243324109353125
case cumsum_16 float32 2.27227783203125
case vector_norm_16 float32 3.5312628746032715
case sum_int int64 6.0
case norm_Scalar_16 float32 3.5312628746032715
case norm_dim_16 float32 5.7798075675964355
case addcmul_32_16_16 float32 -6.9815923273563385
case addcmul_16_16_16 float16 -4.042144775390625
case addcdiv_16_16_32 float32 1.289576180279255
case atan2_16_32 float32 4.501613020896912
case dot_16_32 float32 -1.3139729499816895
case index_put_32_16 float32 2.1439504250884056
case scatter_add_32_16 float32 -0.8784744516015053
case cat_16_32 float32 -0.878474660217762
case grid_sample_16 float16 -5.570625305175781
case relu_16 float16 5.5845947265625
case gelu_16 float16 3.912322998046875
case add_16_32 float32 -0.8784746527671814
case add_16_16 float16 5.7205810546875
case batch_norm_16 float16 -0.001293182373046875
case dropout_16 float16 1.0306396484375
case binary_cross_entropy raises:RuntimeError
"""

MODELS = """
loss resnet 0 0x1.3758000000000p+1
loss resnet 1 0x1.0980000000000p+1
loss resnet 2 0x1.cb80000000000p+0
loss resnet 3 0x1.8e48000000000p+0
loss resnet 4 0x1.5990000000000p+0
loss resnet 5 0x1.2c78000000000p+0
loss gpt 0 0x1.0a0e800000000p+2
loss gpt 1 0x1.0439000000000p+2
loss gpt 2 0x1.fd2f000000000p+1
loss gpt 3 0x1.f454000000000p+1
loss gpt 4 0x1.e9f9000000000p+1
loss gpt 5 0x1.e104000000000p+1
loss unet 0 0x1.33fafc0000000p+0
loss unet 1 0x1.126bf00000000p+0
loss unet 2 0x1.f3f5600000000p-1
loss unet 3 0x1.cf635c0000000p-1
loss unet 4 0x1.b2fa400000000p-1
loss unet 5 0x1.9c59e00000000p-1
loss lstm 0 0x1.f522aa0000000p+1
loss lstm 1 0x1.f358000000000p+1
loss lstm 2 0x1.f181560000000p+1
loss lstm 3 0x1.ef86aa0000000p+1
loss lstm 4 0x1.ed61560000000p+1
loss lstm 5 0x1.eaf5560000000p+1
"""
