/*
 * optim.c — AdamW with bias correction and decoupled weight decay, gradient clipping by
 * global norm, and the learning-rate schedule (linear warmup, then cosine decay).
 *
 * The update is applied one tensor (one range of the flat arrays) at a time, with weight
 * decay only on matrices and embeddings (GPT-2 practice). The element-wise formula lives
 * in the device kernels (layers_cpu.c: cpu_adamw) and follows torch.optim.AdamW.
 */
#include "model/model.h"

#include <math.h>

train_hparams train_hparams_default(void) {
  train_hparams hp = {
      .lr = 3e-3f,
      .min_lr_frac = 0.1f,
      .warmup = 20,
      .steps = 600,
      .beta1 = 0.9f,
      .beta2 = 0.95f,
      .eps = 1e-8f,
      .weight_decay = 0.1f,
      .grad_clip = 1.0f,
  };
  return hp;
}

float train_lr_at(const train_hparams *hp, long step) {
  if (step < hp->warmup) return hp->lr * (float)(step + 1) / (float)hp->warmup;
  float min_lr = hp->lr * hp->min_lr_frac;
  if (step >= hp->steps || hp->steps <= hp->warmup) return min_lr;
  double ratio = (double)(step - hp->warmup) / (double)(hp->steps - hp->warmup);
  double coeff = 0.5 * (1.0 + cos(M_PI * ratio)); /* 1 -> 0 */
  return (float)(min_lr + coeff * (hp->lr - min_lr));
}

float train_clip_grads(train_model *m, const train_hparams *hp) {
  /* the norm of the whole model, not of this rank's slice when the layers are split:
   * the installed layer operations know which tensors are */
  return train_clip_grads_sq(m, hp, m->layer_ops->grad_sumsq(m));
}

float train_clip_grads_sq(train_model *m, const train_hparams *hp, double sq) {
  float norm = (float)sqrt(sq);
  if (hp->grad_clip > 0.0f) {
    /* same rule as torch.nn.utils.clip_grad_norm_ */
    float coef = hp->grad_clip / (norm + 1e-6f);
    if (coef < 1.0f) {
      if (m->bf16)
        m->ops->scale_bf16(m->grads16, coef, m->nparams);
      else
        m->ops->scale(m->grads, coef, m->nparams);
    }
  }
  return norm;
}

void train_adamw_step(train_model *m, const train_hparams *hp, float lr, long t) {
  const train_ops *o = m->ops;
  if (!m->adam_m) {
    m->adam_m = o->alloc(m->nparams * sizeof(float));
    m->adam_v = o->alloc(m->nparams * sizeof(float));
  }
  float bc1 = (float)(1.0 - pow(hp->beta1, (double)t));
  float bc2 = (float)(1.0 - pow(hp->beta2, (double)t));
  for (int i = 0; i < m->ntensors; i++) {
    const train_param *p = &m->tensors[i];
    size_t off = p->offset;
    if (m->bf16) /* the fp32 master weights from bf16 gradients, then their bf16 copy */
      o->adamw_bf16(m->params + off, m->params16 + off, m->grads16 + off, m->adam_m + off,
                    m->adam_v + off, p->numel, lr, hp->beta1, hp->beta2, hp->eps,
                    p->decay ? hp->weight_decay : 0.0f, bc1, bc2);
    else
      o->adamw(m->params + off, m->grads + off, m->adam_m + off, m->adam_v + off, p->numel, lr,
               hp->beta1, hp->beta2, hp->eps, p->decay ? hp->weight_decay : 0.0f, bc1, bc2);
  }
}

int train_copy_opt_to_host(const train_model *m, float *m_dst, float *v_dst) {
  size_t bytes = m->nparams * sizeof(float);
  if (!m->adam_m) {
    for (size_t i = 0; i < m->nparams; i++) m_dst[i] = v_dst[i] = 0.0f;
    return 0;
  }
  m->ops->to_host(m_dst, m->adam_m, bytes);
  m->ops->to_host(v_dst, m->adam_v, bytes);
  return 1;
}

void train_copy_opt_from_host(train_model *m, const float *m_src, const float *v_src) {
  size_t bytes = m->nparams * sizeof(float);
  if (!m->adam_m) {
    m->adam_m = m->ops->alloc(bytes);
    m->adam_v = m->ops->alloc(bytes);
  }
  m->ops->to_device(m->adam_m, m_src, bytes);
  m->ops->to_device(m->adam_v, v_src, bytes);
}
