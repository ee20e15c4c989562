# FindNCCL.cmake — NCCL's header and shared library: the multi-GPU transport of issue 30.
#
# Looks in, in this order: NCCL_ROOT (a CMake or environment variable) and the environment's
# NCCL_HOME; the CUDA toolkit's directories (some images install NCCL there); the system's
# default paths; then the pip package nvidia-nccl-cu13 (its nvidia/nccl/include and
# nvidia/nccl/lib) on the sys.path of Python3_EXECUTABLE when the project was given one, else of
# the `python3` on PATH. The library is looked for beside the header first, so that both come
# from one install.
#
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION (from nccl.h) and the imported
# target NCCL::nccl (a shared library: the pip package ships libnccl.so.2 only, no libnccl.so).

set(_nccl_python "${Python3_EXECUTABLE}")
if(NOT _nccl_python)
  set(_nccl_python python3)
endif()
execute_process(
  COMMAND "${_nccl_python}" -c
    "import os, sys; print(';'.join(p for p in (os.path.join(d, 'nvidia', 'nccl') for d in sys.path if d) if os.path.isfile(os.path.join(p, 'include', 'nccl.h'))))"
  OUTPUT_VARIABLE _nccl_pip_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _nccl_py_rc)
if(NOT _nccl_py_rc EQUAL 0)
  set(_nccl_pip_dirs "")
endif()

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_INCLUDE_DIRS}
  PATHS ${_nccl_pip_dirs}
  PATH_SUFFIXES include)
if(NCCL_INCLUDE_DIR)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
    PATHS ${NCCL_INCLUDE_DIR}/.. PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
endif()
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
  PATHS ${_nccl_pip_dirs}
  PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_defines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_nccl_defines}")
    set(_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
unset(_nccl_python)
unset(_nccl_pip_dirs)
unset(_nccl_py_rc)
