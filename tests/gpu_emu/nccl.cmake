# NCCL on the emulated device (label gpu_emu), included by CMakeLists.txt here:
# - the NCCL collective test (tests/collective) built against the emulator, at 1, 2
#   and 4 ranks; the emulator always has a device per rank, so a skip fails;
# - test_emu_nccl: the NCCL stand-in itself (tests/cuda_emu/nccl.cpp), every
#   operation, type and root, groups, non-blocking init, abort, caught misuses;
# - a peer that never joins an all-reduce (NcclComm's deadline and abort), 2 ranks;
# - message_passing --device cuda at 4 ranks (its emulator build);
# - bench/allreduce_bench --comm nccl at 2 ranks: every row's #wrong must be 0.
set(RD_EMU_NCCL_DEVICES RD_EMU_DEVICE_COUNT=4)  # one emulated GPU per rank at 4 ranks

if(TARGET rd_cuda_emu)
  add_executable(nccl_collective_test_emu ${PROJECT_SOURCE_DIR}/tests/collective/nccl_collective_test.cpp)
  target_link_libraries(nccl_collective_test_emu PRIVATE rd_cuda_emu rd_dist)
  target_compile_definitions(nccl_collective_test_emu PRIVATE RESNET_DDP_HAVE_CUDA=1)
  target_compile_options(nccl_collective_test_emu PRIVATE ${RD_WARNINGS})
  foreach(np 1 2 4)
    rd_add_mpi_test(nccl_collective_emu_np${np} ${np} COMMAND $<TARGET_FILE:nccl_collective_test_emu>
                    LABELS gpu_emu TIMEOUT 180)
    set_property(TEST nccl_collective_emu_np${np} APPEND PROPERTY ENVIRONMENT ${RD_EMU_NCCL_DEVICES})
    # Exit 77 means "fewer GPUs than ranks": never true here, so it must fail, not skip.
    set_tests_properties(nccl_collective_emu_np${np} PROPERTIES SKIP_RETURN_CODE -1)
  endforeach()

  # A peer that never joins: the deadline, ncclCommAbort with the operation pending,
  # and a teardown that does not hang, through the project's NcclComm.
  add_executable(nccl_timeout_test_emu ${CMAKE_CURRENT_LIST_DIR}/nccl_timeout_test.cpp)
  target_link_libraries(nccl_timeout_test_emu PRIVATE rd_cuda_emu rd_dist)
  target_compile_options(nccl_timeout_test_emu PRIVATE ${RD_WARNINGS})
  rd_add_mpi_test(nccl_timeout_emu_np2 2 COMMAND $<TARGET_FILE:nccl_timeout_test_emu> LABELS gpu_emu TIMEOUT 120)
  set_property(TEST nccl_timeout_emu_np2 APPEND PROPERTY ENVIRONMENT ${RD_EMU_NCCL_DEVICES}
               RD_COLLECTIVE_TIMEOUT_S=3)
  set_tests_properties(nccl_timeout_emu_np2 PROPERTIES SKIP_RETURN_CODE -1)

  # The all-reduce benchmark's NCCL path (build/gpu_emu/allreduce_bench): small sizes,
  # a short time per size; it exits 1 when a row's #wrong is not 0.
  add_executable(allreduce_bench_emu ${PROJECT_SOURCE_DIR}/bench/allreduce_bench.cpp)
  set_target_properties(allreduce_bench_emu PROPERTIES OUTPUT_NAME allreduce_bench
                        RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/gpu_emu)
  target_link_libraries(allreduce_bench_emu PRIVATE rd_cuda_emu rd_dist)
  target_compile_options(allreduce_bench_emu PRIVATE ${RD_WARNINGS})
  rd_add_mpi_test(allreduce_bench_emu_np2 2 COMMAND $<TARGET_FILE:allreduce_bench_emu> --comm nccl --min-kb 1
                  --max-mb 1 --seconds 0.01 LABELS gpu_emu TIMEOUT 180)
  set_property(TEST allreduce_bench_emu_np2 APPEND PROPERTY ENVIRONMENT ${RD_EMU_NCCL_DEVICES})
  set_tests_properties(allreduce_bench_emu_np2 PROPERTIES SKIP_RETURN_CODE -1
                       PASS_REGULAR_EXPRESSION "#wrong" FAIL_REGULAR_EXPRESSION "wrong elements")
endif()

if(TARGET rd_cuda_emu_runtime)
  add_executable(test_emu_nccl ${CMAKE_CURRENT_LIST_DIR}/nccl_standin_test.cpp)
  target_link_libraries(test_emu_nccl PRIVATE rd_cuda_emu_runtime MPI::MPI_C)
  target_compile_options(test_emu_nccl PRIVATE ${RD_WARNINGS})
  # Both schedules of the emulated streams: "lazy" (the default) and "random" (which
  # also runs the two-stream cases; see the test).
  foreach(np 2 4)
    foreach(schedule lazy random)
      set(name nccl_standin_np${np}_${schedule})
      rd_add_mpi_test(${name} ${np} COMMAND $<TARGET_FILE:test_emu_nccl> LABELS gpu_emu TIMEOUT 180)
      set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT ${RD_EMU_NCCL_DEVICES} RD_EMU_SCHEDULE=${schedule})
      set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE -1)
    endforeach()
  endforeach()
endif()

if(TARGET rd_cuda_emu_runtime)
  # NCCL's rule for CUDA graphs: a collective captured on every rank, or on none. The mixed
  # case passes on the emulator's FAULT (the processes exit non-zero by design).
  add_executable(nccl_capture_mix_test ${CMAKE_CURRENT_LIST_DIR}/nccl_capture_mix_test.cpp)
  target_link_libraries(nccl_capture_mix_test PRIVATE rd_cuda_emu_runtime MPI::MPI_C)
  target_compile_options(nccl_capture_mix_test PRIVATE ${RD_WARNINGS})
  foreach(mode uniform mixed)
    rd_add_mpi_test(nccl_capture_${mode}_np2 2 COMMAND $<TARGET_FILE:nccl_capture_mix_test> ${mode}
                    LABELS gpu_emu TIMEOUT 120)
    set_property(TEST nccl_capture_${mode}_np2 APPEND PROPERTY ENVIRONMENT ${RD_EMU_NCCL_DEVICES})
  endforeach()
  set_tests_properties(nccl_capture_uniform_np2 PROPERTIES PASS_REGULAR_EXPRESSION "nccl_capture_mix_test \\(uniform\\): passed")
  set_tests_properties(nccl_capture_mixed_np2 PROPERTIES PASS_REGULAR_EXPRESSION
    "ncclAllReduce \\(op #[0-9]+ of rank [01]\\): some ranks run it from a CUDA graph and others eagerly")
endif()

if(TARGET message_passing_emu)
  add_test(NAME nccl_message_passing_emu_np4
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/nccl_message_passing_test.sh ${RD_MPIEXEC}
                   $<TARGET_FILE:message_passing_emu> 4)
  set_tests_properties(nccl_message_passing_emu_np4 PROPERTIES LABELS gpu_emu TIMEOUT 120
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1;OMPI_MCA_btl=self,vader,tcp;OMPI_MCA_btl_vader_single_copy_mechanism=none;${RD_EMU_NCCL_DEVICES}")
endif()
