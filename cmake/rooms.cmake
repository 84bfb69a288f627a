# Rooms: the folders inside model/ and datasets/, one concern each, each a static library of its
# own whose links say which rooms it may include (docs/engine.md draws the graph).
#
#   pipeline_room(<room> [SOURCES <files>] [TORCH_SOURCES <files>] [ROOMS <rooms>]
#                 [BASE_ROOMS <rooms>] [LIBS <libraries>] [PRIVATE_LIBS <libraries>])
#
# <room> is the folder, "model/net" or "datasets/shards"; its files are named relative to it.
#   SOURCES        torch-free sources: library pipeline_<top>_<name> (datasets/), or
#                  pipeline_<top>_<name>_base (model/, whose torch-free half the light `pipeline`
#                  command and the torch-free tests link)
#   TORCH_SOURCES  sources that include LibTorch (model/ only): library pipeline_<top>_<name>,
#                  which links its torch-free half
#   ROOMS          the rooms below this one that it may include: each must be declared already,
#                  so the order of the declarations is the order of the layers and no cycle can
#                  be written
#   BASE_ROOMS     the same, for a model/ room's torch-free half (torch-free halves of rooms only)
#   LIBS / PRIVATE_LIBS  other libraries (pipeline_base, zstd, ...)
#
# Every room is recorded in the global property PIPELINE_ROOMS with the rooms it may include;
# pipeline_write_rooms() writes them to ${CMAKE_BINARY_DIR}/rooms.txt, which tests/check_layers.py
# holds every #include of the tree against.
function(pipeline_room room)
  cmake_parse_arguments(R "" "" "SOURCES;TORCH_SOURCES;ROOMS;BASE_ROOMS;LIBS;PRIVATE_LIBS" ${ARGN})
  string(REPLACE "/" "_" name "${room}")
  set(target pipeline_${name})
  set(dir ${CMAKE_SOURCE_DIR}/${room})
  list(TRANSFORM R_SOURCES PREPEND ${dir}/)
  list(TRANSFORM R_TORCH_SOURCES PREPEND ${dir}/)
  foreach(below IN LISTS R_ROOMS R_BASE_ROOMS)
    get_property(known GLOBAL PROPERTY PIPELINE_ROOM_DECLARED_${below})
    if(NOT known)
      message(FATAL_ERROR "room ${room}: ${below} is not a room declared before it (rooms are declared "
                          "bottom-up, so that no room includes one above it)")
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY PIPELINE_ROOM_DECLARED_${room} TRUE)
  set_property(GLOBAL PROPERTY PIPELINE_ROOM_${room} ${R_ROOMS} ${R_BASE_ROOMS})
  set_property(GLOBAL APPEND PROPERTY PIPELINE_ROOMS "${room}")

  # The torch-free library: the whole room in datasets/, the _base half of a model/ room.
  set(free_target ${target})
  if(R_TORCH_SOURCES)
    set(free_target ${target}_base)
  endif()
  set(free_rooms)
  foreach(below IN LISTS R_BASE_ROOMS)
    string(REPLACE "/" "_" b "${below}")
    if(below MATCHES "^model/")
      list(APPEND free_rooms pipeline_${b}_base)
    else()
      list(APPEND free_rooms pipeline_${b})
    endif()
  endforeach()
  if(R_SOURCES)
    add_library(${free_target} STATIC ${R_SOURCES})
  else()
    add_library(${free_target} INTERFACE)
  endif()
  get_target_property(free_type ${free_target} TYPE)
  set(scope PUBLIC)
  if(free_type STREQUAL "INTERFACE_LIBRARY")
    set(scope INTERFACE)
  else()
    target_link_libraries(${free_target} PRIVATE ${R_PRIVATE_LIBS} pipeline_warnings)
    # The LibTorch module (tools/) links these static libraries: position-independent code.
    set_target_properties(${free_target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endif()
  target_include_directories(${free_target} ${scope} ${CMAKE_SOURCE_DIR})
  if(R_TORCH_SOURCES)
    target_link_libraries(${free_target} ${scope} ${free_rooms} pipeline_base)
  else()
    set(room_libs)
    foreach(below IN LISTS R_ROOMS)
      string(REPLACE "/" "_" b "${below}")
      list(APPEND room_libs pipeline_${b})
    endforeach()
    target_link_libraries(${free_target} ${scope} ${room_libs} ${R_LIBS})
    return()
  endif()
  if(NOT PIPELINE_WITH_TORCH)
    return()  # the sanitizer and fuzz builds without LibTorch build the torch-free halves alone
  endif()

  # The LibTorch half of a model/ room.
  set(room_libs)
  foreach(below IN LISTS R_ROOMS)
    string(REPLACE "/" "_" b "${below}")
    list(APPEND room_libs pipeline_${b})
  endforeach()
  add_library(${target} STATIC ${R_TORCH_SOURCES})
  target_include_directories(${target} PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(${target} PUBLIC pipeline_torch ${free_target} ${room_libs} ${R_LIBS}
    PRIVATE ${R_PRIVATE_LIBS} pipeline_warnings)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  pipeline_torch_pch_user(${target})
endfunction()

# Writes rooms.txt: one line per room, "ROOM: ROOMS IT MAY INCLUDE".
function(pipeline_write_rooms)
  get_property(rooms GLOBAL PROPERTY PIPELINE_ROOMS)
  set(text "")
  foreach(room IN LISTS rooms)
    get_property(below GLOBAL PROPERTY PIPELINE_ROOM_${room})
    list(REMOVE_DUPLICATES below)
    list(JOIN below " " below)
    string(APPEND text "${room}: ${below}\n")
  endforeach()
  file(WRITE ${CMAKE_BINARY_DIR}/rooms.txt.tmp "${text}")
  file(COPY_FILE ${CMAKE_BINARY_DIR}/rooms.txt.tmp ${CMAKE_BINARY_DIR}/rooms.txt ONLY_IF_DIFFERENT)
  file(REMOVE ${CMAKE_BINARY_DIR}/rooms.txt.tmp)
endfunction()
