# Installing ebb so that other projects can consume it:
#   CMake:      find_package(ebb) and target_link_libraries(app ebb::ebb)
#   pkg-config: cc app.c $(pkg-config --cflags --libs ebb)
# docs/consuming.md has the details.

include(CMakePackageConfigHelpers)

set(EBB_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ebb)
get_target_property(EBB_LIB_TYPE ebb TYPE)

install(TARGETS ebb EXPORT ebbTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ebb-cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/ebb DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/ebb)

# A shared libebb carries its dependencies itself; a static one needs its
# consumer to link libtorch, libyaml and cJSON too, so the config finds them
# again (with the same search ebb's own build uses).
install(EXPORT ebbTargets NAMESPACE ebb:: DESTINATION ${EBB_CMAKE_DIR})
if(EBB_LIB_TYPE STREQUAL "STATIC_LIBRARY")
  set(EBB_CONFIG_STATIC 1)
  install(FILES cmake/EbbDependencies.cmake DESTINATION ${EBB_CMAKE_DIR})
else()
  set(EBB_CONFIG_STATIC 0)
endif()
configure_package_config_file(cmake/ebbConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/ebbConfig.cmake
                              INSTALL_DESTINATION ${EBB_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ebbConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ebbConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/ebbConfigVersion.cmake
        DESTINATION ${EBB_CMAKE_DIR})

# pkg-config. Libs.private and Requires.private are what a static link needs;
# the rpath lets a program built with `pkg-config --libs ebb` run from any
# prefix without LD_LIBRARY_PATH.
set(EBB_PC_TORCH "")
foreach(t torch torch_cpu torch_cuda c10_cuda c10)
  if(TARGET ${t})
    string(APPEND EBB_PC_TORCH " $<TARGET_FILE:${t}>")
  endif()
endforeach()
# relocatable: the prefix is found from where the .pc file lies
file(RELATIVE_PATH EBB_PC_TO_PREFIX ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig
     ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" EBB_PC_TO_PREFIX "${EBB_PC_TO_PREFIX}")
set(EBB_PC_FILE ${CMAKE_CURRENT_BINARY_DIR}/ebb.pc)
configure_file(cmake/ebb.pc.in ${EBB_PC_FILE}.in @ONLY)
file(GENERATE OUTPUT ${EBB_PC_FILE} INPUT ${EBB_PC_FILE}.in)
install(FILES ${EBB_PC_FILE} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
