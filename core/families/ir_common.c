/* ir_common.c - the vertex functions shared by several families, as op IR
 * (core/cell/cell.h): the output layer, nn.LSTMCell and nn.GRUCell, written
 * from docs/models.md's equations. */
#include "cell/cell.h"
#include "families/families.h"

int cn__ir_output_layer(const cn_model *m, cn_ir *g, int n_in, int W, int B) {
  int H = (int)m->dims.H, x[2];
  for (int k = 0; k < n_in; k++)
    x[k] = cn_ir_src_(g, CN_SRC_INPUT, -1, k, 0, H, "h");
  int C = (int)m->dims.C;
  cn_ir_output(g, cn_ir_linear(g, x, n_in, W, 0, C, B, 0), 0);
  g->state_floats = C;
  return 0;
}

/* The LSTM cells' last step, in every LSTM family alike: h = o ⊙ tanh(c),
 * the vertex's state [h | c]. */
int cn__ir_lstm_state(cn_ir *g, int o, int c, int H) {
  int h = cn_ir_binary(g, CN_IR_MUL, o, cn_ir_unary(g, CN_IR_TANH, c));
  cn_ir_output(g, h, 0);
  cn_ir_output(g, c, H);
  g->state_floats = 2 * H;
  return 0;
}

/* docs/models.md (nn.LSTMCell): rows (i, f, g, o); g = W_ih x + b_ih + W_hh h +
 * b_hh; c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g); h' = σ(o) ⊙ tanh(c'). The
 * previous state [h | c] is input edge 0 (zero when there is none). */
int cn__ir_lstm_cell(const cn_model *m, cn_ir *g, int E, int Wih, int Whh,
                     int bih, int bhh) {
  int H = (int)m->dims.H, D = (int)m->w[E]->shape[1];
  int x = cn_ir_src_(g, CN_SRC_EMBED, E, 0, 0, D, "x");
  int h = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, 0, H, "h");
  int c = cn_ir_src_(g, CN_SRC_INPUT, -1, 0, H, H, "c");
  int gate[4];
  for (int q = 0; q < 4; q++) {
    int a = cn_ir_linear(g, &x, 1, Wih, q * H, H, bih, q * H);
    int b = cn_ir_linear(g, &h, 1, Whh, q * H, H, bhh, q * H);
    gate[q] = cn_ir_binary(g, CN_IR_ADD, a, b);
  }
  int i = cn_ir_unary(g, CN_IR_SIGMOID, gate[0]);
  int f = cn_ir_unary(g, CN_IR_SIGMOID, gate[1]);
  int u = cn_ir_unary(g, CN_IR_TANH, gate[2]);
  int o = cn_ir_unary(g, CN_IR_SIGMOID, gate[3]);
  int c2 = cn_ir_binary(g, CN_IR_ADD, cn_ir_binary(g, CN_IR_MUL, f, c),
                        cn_ir_binary(g, CN_IR_MUL, i, u));
  return cn__ir_lstm_state(g, o, c2, H);
}

/* docs/models.md (nn.GRUCell): rows (r, z, n); r = σ(W_ir x + b_ir + W_hr h +
 * b_hr), z likewise, n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),
 * h' = (1 - z) ⊙ n + z ⊙ h. h is the source hp (any kind). */
int cn__ir_gru_cell(const cn_model *m, cn_ir *g, int x, int hp, int Wih,
                    int Whh, int bih, int bhh) {
  int H = (int)m->dims.H;
  int gi[3], gh[3];
  for (int q = 0; q < 3; q++) {
    gi[q] = cn_ir_linear(g, &x, 1, Wih, q * H, H, bih, q * H);
    gh[q] = cn_ir_linear(g, &hp, 1, Whh, q * H, H, bhh, q * H);
  }
  int r = cn_ir_unary(g, CN_IR_SIGMOID, cn_ir_binary(g, CN_IR_ADD, gi[0], gh[0]));
  int z = cn_ir_unary(g, CN_IR_SIGMOID, cn_ir_binary(g, CN_IR_ADD, gi[1], gh[1]));
  int n = cn_ir_unary(
      g, CN_IR_TANH,
      cn_ir_binary(g, CN_IR_ADD, gi[2], cn_ir_binary(g, CN_IR_MUL, r, gh[2])));
  int h = cn_ir_binary(
      g, CN_IR_ADD,
      cn_ir_binary(g, CN_IR_MUL, cn_ir_const_op(g, CN_IR_RSUB, 1.0f, z), n),
      cn_ir_binary(g, CN_IR_MUL, z, hp));
  cn_ir_output(g, h, 0);
  g->state_floats = H;
  return 0;
}
