# Apache Arrow C++ and its Parquet reader, from the pinned pyarrow wheel (tools/setup.sh installs
# it into a venv of its own under PIPELINE_CACHE and passes PIPELINE_ARROW_DIR, the wheel's
# `pyarrow` package directory). Debian ships no Arrow; the wheel carries the C++ headers in
# include/ and the libraries as libarrow.so.2600 / libparquet.so.2600 with no unversioned links,
# so the versioned files are imported by full path (CMake then puts their directory in the build
# rpath). The wheel's C++ ABI (libstdc++, new std::string) is the one Debian's g++ and clang use.
#
# Defines the target pipeline_parquet (headers as SYSTEM + both libraries) and sets
# PIPELINE_HAVE_PARQUET. PIPELINE_WITH_PARQUET=OFF leaves Parquet out (datasets/ then refuses
# .parquet inputs with a sentence saying so).
option(PIPELINE_WITH_PARQUET "Read Parquet datasets with Arrow C++ from the pyarrow wheel (PIPELINE_ARROW_DIR)" ON)
set(PIPELINE_ARROW_DIR "" CACHE PATH "The pyarrow package directory (site-packages/pyarrow) of pyarrow==26.0.1")
set(PIPELINE_ARROW_PYTHON "" CACHE FILEPATH "Python with pyarrow, for the tests' Parquet files (default: set-up's venv)")
set(PIPELINE_ARROW_SOVERSION 2600)

set(PIPELINE_HAVE_PARQUET OFF)
if(PIPELINE_WITH_PARQUET)
  if(NOT PIPELINE_ARROW_DIR)
    # Without set-up's venv, try the python3 on PATH.
    execute_process(COMMAND python3 -c "import pyarrow, os; print(os.path.dirname(pyarrow.__file__))"
      OUTPUT_VARIABLE probed OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0)
      set(PIPELINE_ARROW_DIR ${probed} CACHE PATH "" FORCE)
    endif()
  endif()
  set(arrow_lib ${PIPELINE_ARROW_DIR}/libarrow.so.${PIPELINE_ARROW_SOVERSION})
  set(parquet_lib ${PIPELINE_ARROW_DIR}/libparquet.so.${PIPELINE_ARROW_SOVERSION})
  if(NOT EXISTS ${arrow_lib} OR NOT EXISTS ${parquet_lib} OR NOT EXISTS ${PIPELINE_ARROW_DIR}/include/parquet/arrow/reader.h)
    message(FATAL_ERROR "Parquet: no pyarrow ${PIPELINE_ARROW_SOVERSION} wheel at PIPELINE_ARROW_DIR='${PIPELINE_ARROW_DIR}' "
      "(expected libarrow.so.${PIPELINE_ARROW_SOVERSION}, libparquet.so.${PIPELINE_ARROW_SOVERSION} and include/). "
      "Run tools/setup.sh (it installs pyarrow==26.0.1 into its cache), point PIPELINE_ARROW_DIR at a pyarrow "
      "package directory, or configure with -DPIPELINE_WITH_PARQUET=OFF.")
  endif()
  if(NOT PIPELINE_ARROW_PYTHON)
    get_filename_component(venv_python ${PIPELINE_ARROW_DIR}/../../../../bin/python ABSOLUTE)
    if(EXISTS ${venv_python})
      set(PIPELINE_ARROW_PYTHON ${venv_python} CACHE FILEPATH "" FORCE)
    else()
      set(PIPELINE_ARROW_PYTHON python3 CACHE FILEPATH "" FORCE)
    endif()
  endif()
  add_library(pipeline_parquet INTERFACE)
  target_include_directories(pipeline_parquet SYSTEM INTERFACE ${PIPELINE_ARROW_DIR}/include)
  target_link_libraries(pipeline_parquet INTERFACE ${parquet_lib} ${arrow_lib})
  target_compile_definitions(pipeline_parquet INTERFACE PIPELINE_HAVE_PARQUET=1)
  set(PIPELINE_HAVE_PARQUET ON)
  message(STATUS "Parquet: Arrow C++ from ${PIPELINE_ARROW_DIR}")
else()
  message(STATUS "Parquet: off (PIPELINE_WITH_PARQUET=OFF)")
endif()
