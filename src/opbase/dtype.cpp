#include "opbase/dtype.h"

extern "C" {
const char* strata_dtype_name(int32_t dtype) { return strata::dtype_name(dtype); }
size_t strata_dtype_size(int32_t dtype) { return strata::dtype_size(dtype); }
uint16_t strata_f32_to_bf16(float x) { return strata::f32_to_bf16_bits(x); }
float strata_bf16_to_f32(uint16_t x) { return strata::bf16_bits_to_f32(x); }
uint16_t strata_f32_to_f16(float x) { return strata::f32_to_f16_bits(x); }
float strata_f16_to_f32(uint16_t x) { return strata::f16_bits_to_f32(x); }
}
