/* fake_object.c — a shared object with nothing in it, for test_cuda's loader checks: it
 * is dlopened under its own name (an ordinary library) and copied under the name of the
 * CUDA driver (libcuda.so.*), which is all coll_cuda_driver_loaded looks at.  Must never
 * be linked into anything: the tests load it at run time. */
int coll_test_fake_object(void);
int coll_test_fake_object(void) { return 42; }
