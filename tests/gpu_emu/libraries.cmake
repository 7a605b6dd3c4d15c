# The cuBLAS and cuDNN stand-ins of the emulated device against float64 references
# (included by tests/gpu_emu/CMakeLists.txt). The cases run on an emulated H200;
# those tagged [device] run again on an emulated RTX 5000 (sm_75: no TF32, no bf16).
if(TARGET rd_cuda_emu_runtime)
  add_executable(test_emu_libraries ${CMAKE_CURRENT_LIST_DIR}/libraries_test.cpp)
  target_link_libraries(test_emu_libraries PRIVATE rd_cuda_emu_runtime rd_base Catch2::Catch2)
  # emu.h as cuda_emu/emu.h, the float64 reference as reference/reference_ops.h.
  target_include_directories(test_emu_libraries PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_compile_options(test_emu_libraries PRIVATE ${RD_WARNINGS})
  catch_discover_tests(test_emu_libraries PROPERTIES LABELS "gpu_emu" SKIP_RETURN_CODE 77)
  catch_discover_tests(test_emu_libraries TEST_SPEC "[device]" TEST_PREFIX "rtx5000/"
                       PROPERTIES LABELS "gpu_emu" SKIP_RETURN_CODE 77 ENVIRONMENT "RD_EMU_DEVICE=rtx5000")
  # [memory]: Find on a device with 1 MiB of memory (workspaces that cannot be allocated).
  catch_discover_tests(test_emu_libraries TEST_SPEC "[memory]" TEST_PREFIX "1MiB/"
                       PROPERTIES LABELS "gpu_emu" SKIP_RETURN_CODE 77 ENVIRONMENT "RD_EMU_MEMORY_MIB=1")
endif()
