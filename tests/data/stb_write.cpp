// stb_image_write implementation for the data test programs (kept in its own
// translation unit so the callers' small constant arrays are not inlined into it).
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
